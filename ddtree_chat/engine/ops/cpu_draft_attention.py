"""The drafter's attention on the CPU as one fused call (torch's scaled_dot_product_attention, GQA): the block's
B queries over the held context and the block itself. ops.draft_attention_ref's einsum form (four products, a
concatenation and a softmax over small tensors) costs several times more there in per-call overhead. The
drafter is outside the exactness contract (it only proposes the tree), so its bits may differ from the
reference's; tests/test_cpu_draft_attention.py holds them close."""

from __future__ import annotations

import torch
import torch.nn.functional as F

ENABLED = True  # NOTE: benchmarks/cpu_pack_ab.py --what sdpa turns it off and on between replies


def serves(q: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """A CPU call whose visible keys are the held context and the whole block (mask None or a held count)."""
    return ENABLED and q.device.type == "cpu" and (mask is None or mask.dtype != torch.bool)


def draft_attention_cpu(q: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor, k_blk: torch.Tensor,
                        v_blk: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """ops.draft_attention_ref's contract for the calls `serves` accepts: q [B, nh, d]; k/v [n, kv, d] and
    [B, kv, d]; mask None or an integer tensor [1] (the held context entries) -> [B, nh, d]."""
    held = k_ctx.shape[0] if mask is None else int(mask)
    k = torch.cat([k_ctx[:held], k_blk]).transpose(0, 1)  # [kv, held + B, d]
    v = torch.cat([v_ctx[:held], v_blk]).transpose(0, 1)
    o = F.scaled_dot_product_attention(q.transpose(0, 1), k, v, scale=scale, enable_gqa=True)  # [nh, B, d]
    return o.transpose(0, 1)
