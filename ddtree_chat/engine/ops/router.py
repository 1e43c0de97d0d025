"""noaux_tc router: sigmoid scores, bias used for selection only, unbiased renormalised weights."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .registry import dispatch, fast


def router_logits_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [T, H], w [E, H] -> float32 [T, E]: the router's product in float32, whatever the model's dtype."""
    return F.linear(x.float(), w.float())


def router_logits(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return dispatch("router_logits", x, router_logits_ref, x, w)


def route_ref(logits: torch.Tensor, bias: torch.Tensor, top_k: int, scale: float, n_group: int = 1,
              topk_group: int = 1, normalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] float32 -> (ids [T, k] int64, weights [T, k] float32)."""
    scores = torch.sigmoid(logits.float())
    biased = scores + bias.float()
    if n_group > 1:
        t, e = biased.shape
        grouped = biased.view(t, n_group, e // n_group)
        group_score = grouped.topk(2, dim=-1).values.sum(-1)  # [T, G]
        keep = torch.zeros_like(group_score).scatter_(1, group_score.topk(topk_group, dim=-1).indices, 1.0)
        biased = biased.masked_fill(~keep.bool().repeat_interleave(e // n_group, dim=1), float("-inf"))
    ids = biased.topk(top_k, dim=-1).indices
    w = scores.gather(1, ids)
    if normalize:
        w = w / w.sum(-1, keepdim=True)
    return ids, w * scale


def route(logits, bias, top_k, scale, n_group=1, topk_group=1, normalize=True):
    fn = fast("route", logits)
    if fn and n_group == 1:
        return fn(logits, bias, top_k, scale, normalize)
    return route_ref(logits, bias, top_k, scale, n_group, topk_group, normalize)
