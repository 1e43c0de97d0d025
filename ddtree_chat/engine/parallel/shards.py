"""How each target or drafter tensor is split over the tensor-parallel ranks (the loader reads its shard by it)."""

from __future__ import annotations


def shard_dim(name: str) -> int | None:
    """How a target or drafter tensor (checkpoint name minus prefix) is split under TP: 0 = rows (output
    features / heads / vocab), 1 = columns (input features), None = replicated."""
    if name in ("embed_tokens.weight", "lm_head.weight"):
        return 0
    if name.endswith(("self_attn.q_b_proj.weight", "self_attn.q_proj.weight", "self_attn.kv_b_proj.weight",
                      "self_attn.k_proj.weight", "self_attn.v_proj.weight")):  # the last two: the drafter's
        return 0
    if name == "fc.weight":  # the drafter's feature projection: its input features
        return 1
    if name.endswith("self_attn.o_proj.weight"):
        return 1
    if name.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight", "shared_experts.gate_proj.weight",
                      "shared_experts.up_proj.weight")):
        return 0
    if name.endswith(("mlp.down_proj.weight", "shared_experts.down_proj.weight")):
        return 1
    return None
