"""The drafter's attention (docs/architecture.md, the drafter): one block of B queries (GQA) over its cached context and the block
itself, softmaxed together. Context and block keys are scored separately, so the context (a static-size
buffer under graphs) is read once and never concatenated or repeated per query head."""

from __future__ import annotations

import torch

from . import cpu_draft_attention
from .registry import define


def draft_attention_ref(q: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor, k_blk: torch.Tensor,
                        v_blk: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """q [B, nh, d]; k_ctx/v_ctx [n, kv, d]; k_blk/v_blk [B, kv, d]; mask [B, n + B] bool, or an integer
    tensor [1] (the graphs' device count: the first that many context entries and the whole block are
    visible), or None (everything visible) -> [B, nh, d]. Query head h reads kv head h // (nh / kv)."""
    nkv = k_ctx.shape[-2]
    if mask is not None and mask.dtype != torch.bool and mask.device.type == "cpu":
        held = int(mask)  # NOTE: free on the CPU: slice the held entries instead of masking the span
        k_ctx, v_ctx, mask = k_ctx[:held], v_ctx[:held], None
    if mask is not None and mask.dtype != torch.bool:
        b, n = q.shape[0], k_ctx.shape[0]
        held = torch.arange(n, device=q.device) < mask.to(q.device)
        mask = torch.cat([held.expand(b, n), torch.ones(b, b, dtype=torch.bool, device=q.device)], -1)
    q = q.unflatten(-2, (nkv, q.shape[-2] // nkv)) * scale  # [B, kv, rep, d]
    s = torch.cat([torch.einsum("bgrd,ngd->grbn", q, k_ctx), torch.einsum("bgrd,mgd->grbm", q, k_blk)], -1)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    p = s.softmax(-1)  # [kv, rep, B, n + B]
    n = k_ctx.shape[0]
    o = torch.einsum("grbn,ngd->bgrd", p[..., :n], v_ctx) + torch.einsum("grbm,mgd->bgrd", p[..., n:], v_blk)
    return o.flatten(-3, -2)


DRAFT_ATTENTION = define("draft_attention", draft_attention_ref)


def draft_attention(q, k_ctx, v_ctx, k_blk, v_blk, mask, scale):
    if cpu_draft_attention.serves(q, mask):  # NOTE: the CPU's one fused call (ops/cpu_draft_attention.py)
        return cpu_draft_attention.draft_attention_cpu(q, k_ctx, v_ctx, k_blk, v_blk, mask, scale)
    return DRAFT_ATTENTION(q, k_ctx, v_ctx, k_blk, v_blk, mask, scale)
