"""MLA attention over the latent cache. Keys 0..prefix_len-1 are committed context (visible to every
query); keys prefix_len..prefix_len+T-1 are this forward's own tokens, visible per `tree_mask`.

prefix_len is a host int (eager) or a device tensor [1] (static shapes, CUDA graphs: the whole cache
buffer is attended under a length mask, so nothing depends on a host value)."""

from __future__ import annotations

import torch

from . import cpu_exact
from .registry import define


def _full_mask(prefix_len: int, tree_mask: torch.Tensor) -> torch.Tensor:
    prefix = torch.ones(*tree_mask.shape[:-1], prefix_len, dtype=torch.bool, device=tree_mask.device)
    return torch.cat([prefix, tree_mask], dim=-1)  # [T, prefix_len + T]


def _slot_mask(prefix_len: torch.Tensor, tree_mask: torch.Tensor, s: int) -> torch.Tensor:
    """[T, S] over every cache slot: slots < prefix_len visible, the T tree slots per tree_mask."""
    t = tree_mask.shape[-1]
    j = torch.arange(s, device=tree_mask.device)
    rel = j - prefix_len.to(j.device).reshape(())
    in_tree = (rel >= 0) & (rel < t)
    return (rel < 0) | (tree_mask[:, rel.clamp(0, t - 1)] & in_tree)


def mla_attention_ref(q_lat: torch.Tensor, q_pe: torch.Tensor, ckv: torch.Tensor, kpe: torch.Tensor,
                      prefix_len: int, tree_mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Absorbed form. q_lat [..., T, h, r], q_pe [..., T, h, p], ckv [..., S, r], kpe [..., S, p]
    with S >= prefix_len + T (an int, or a device tensor [1]); tree_mask [T, T] bool -> o_lat [..., T, h, r]."""
    t = q_lat.shape[-3]
    if torch.is_tensor(prefix_len) and prefix_len.device.type == "cpu":
        prefix_len = int(prefix_len)  # NOTE: free on the CPU: slice the prefix instead of masking the whole buffer
    if q_lat.dim() == 3 and ckv.dim() == 2 and cpu_exact.enabled(q_lat):
        return cpu_exact.mla_attention(q_lat, q_pe, ckv, kpe, prefix_len, tree_mask, scale)
    if torch.is_tensor(prefix_len):
        visible = _slot_mask(prefix_len, tree_mask, ckv.shape[-2])
    else:
        ckv, kpe = ckv[..., : prefix_len + t, :], kpe[..., : prefix_len + t, :]
        visible = _full_mask(prefix_len, tree_mask)
    scores = torch.einsum("...thr,...sr->...hts", q_lat.float(), ckv.float())
    scores = scores + torch.einsum("...thp,...sp->...hts", q_pe.float(), kpe.float())
    scores = scores * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = scores.softmax(-1)
    return torch.einsum("...hts,...sr->...thr", probs, ckv.float()).to(q_lat.dtype)


def mla_attention_naive_ref(q_nope, q_pe, ckv, kpe, w_uk, w_uv, prefix_len, tree_mask, scale):
    """Non-absorbed form (the test oracle): decompress K/V per head.
    q_nope [T, h, dn], w_uk [h, dn, r], w_uv [h, dv, r] -> o [T, h, dv]."""
    t = q_nope.shape[0]
    ckv, kpe = ckv[: prefix_len + t], kpe[: prefix_len + t]
    k_nope = torch.einsum("sr,hdr->shd", ckv, w_uk)
    v = torch.einsum("sr,hdr->shd", ckv, w_uv)
    scores = torch.einsum("thd,shd->hts", q_nope, k_nope) + torch.einsum("thp,sp->hts", q_pe, kpe)
    scores = (scores * scale).masked_fill(~_full_mask(prefix_len, tree_mask), float("-inf"))
    return torch.einsum("hts,shd->thd", scores.softmax(-1), v)


MLA_ATTENTION = define("mla_attention", mla_attention_ref)


def mla_attention(q_lat, q_pe, ckv, kpe, prefix_len, tree_mask, scale):
    return MLA_ATTENTION(q_lat, q_pe, ckv, kpe, prefix_len, tree_mask, scale)
