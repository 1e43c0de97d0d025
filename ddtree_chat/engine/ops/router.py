"""noaux_tc router: sigmoid scores, bias used for selection only, unbiased renormalised weights."""

from __future__ import annotations

import weakref

import torch

from . import cpu_exact
from .linear import linear, linear_ref
from .registry import define

_F32: dict[int, tuple[weakref.ref, int, torch.Tensor]] = {}  # id(weight) -> (weight, its version, float32 copy)


def float32_weight(w: torch.Tensor) -> torch.Tensor:
    """w itself in float32; else its float32 copy, made once (the loader calls this at load) and made again
    only if w changed in place. The gate's cast was a [E, H] copy per layer and call."""
    if w.dtype == torch.float32:
        return w
    entry = _F32.get(id(w))
    if entry is None or entry[0]() is not w or entry[1] != w._version:
        with torch.no_grad():
            entry = (weakref.ref(w, lambda _, key=id(w): _F32.pop(key, None)), w._version, w.detach().float())
        _F32[id(w)] = entry
    return entry[2]


def router_logits_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [T, H], w [E, H] -> float32 [T, E]: the router's product in float32, whatever the model's dtype."""
    return linear_ref(x.float(), w.float())


def _logits_of_copy(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """router_logits_ref against w's float32 copy (float32_weight), not a cast per call."""
    return linear_ref(x.float(), float32_weight(w))


def router_through_products(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """router_logits_ref through the product op's dispatch (ops.linear) on w's float32 copy: a CUDA kernel form."""
    return linear(x.float(), float32_weight(w))


ROUTER_LOGITS = define("router_logits", _logits_of_copy)


def router_logits(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [T, H], w [E, H] (the gate as loaded: a kernel may use it in its own dtype) -> float32 [T, E]."""
    if w.requires_grad and torch.is_grad_enabled():  # NOTE: training: the cast stays in autograd's graph
        return router_logits_ref(x, w)
    return ROUTER_LOGITS(x, w)


def route_ref(logits: torch.Tensor, bias: torch.Tensor, top_k: int, scale: float, n_group: int = 1,
              topk_group: int = 1, normalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] float32 -> (ids [T, k] int64, weights [T, k] float32)."""
    logits = logits.float()
    scores = cpu_exact.whole_blocks(torch.sigmoid, logits) if cpu_exact.enabled(logits) else torch.sigmoid(logits)
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


ROUTE = define("route", route_ref)


def route(logits, bias, top_k, scale, n_group=1, topk_group=1, normalize=True):
    return ROUTE(logits, bias, top_k, scale, n_group, topk_group, normalize)
