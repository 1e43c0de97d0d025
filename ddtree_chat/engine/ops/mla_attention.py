"""MLA attention over the latent cache. Keys 0..prefix_len-1 are committed context (visible to every
query); keys prefix_len..prefix_len+T-1 are this forward's own tokens, visible per `tree_mask`."""

from __future__ import annotations

import torch

from .registry import fast


def _full_mask(prefix_len: int, tree_mask: torch.Tensor) -> torch.Tensor:
    prefix = torch.ones(*tree_mask.shape[:-1], prefix_len, dtype=torch.bool, device=tree_mask.device)
    return torch.cat([prefix, tree_mask], dim=-1)  # [T, prefix_len + T]


def mla_attention_ref(q_lat: torch.Tensor, q_pe: torch.Tensor, ckv: torch.Tensor, kpe: torch.Tensor,
                      prefix_len: int, tree_mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Absorbed form. q_lat [..., T, h, r], q_pe [..., T, h, p], ckv [..., S, r], kpe [..., S, p]
    with S >= prefix_len + T; tree_mask [T, T] bool -> o_lat [..., T, h, r]."""
    t = q_lat.shape[-3]
    ckv, kpe = ckv[..., : prefix_len + t, :], kpe[..., : prefix_len + t, :]
    scores = torch.einsum("...thr,...sr->...hts", q_lat.float(), ckv.float())
    scores = scores + torch.einsum("...thp,...sp->...hts", q_pe.float(), kpe.float())
    scores = scores * scale
    scores = scores.masked_fill(~_full_mask(prefix_len, tree_mask), float("-inf"))
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


def mla_attention(q_lat, q_pe, ckv, kpe, prefix_len, tree_mask, scale):
    fn = fast("mla_attention", q_lat)
    if fn:
        return fn(q_lat, q_pe, ckv, kpe, prefix_len, tree_mask, scale)
    return mla_attention_ref(q_lat, q_pe, ckv, kpe, prefix_len, tree_mask, scale)
