"""Hot-path ops. Each module holds a pure-torch reference (`*_ref`, the CPU path and the test oracle)
and its registry.Op, whose dispatching entry runs the first CUDA/Triton kernel that ops/gpu.py
registered for the call (dtypes, supports), else the reference.

The model calls only the dispatching names exported here."""

from .draft_attention import draft_attention, draft_attention_ref
from .latent import latent_write, latent_write_ref, move_rows, move_rows_ref
from .linear import (Linear, linear, linear_add, linear_add_ref, linear_glu, matmul_nt, matmul_nt_glu, matmul_nt_glu_ref,
                     matmul_nt_ref, rms_norm_linear, rms_norm_linear_ref, routed_glu, routed_glu_ref, stack_weights)
from .mla_attention import mla_attention, mla_attention_ref, mla_attention_naive_ref
from .moe import moe_experts, moe_experts_dense, moe_experts_ref
from .norm import add_rms_norm, add_rms_norm_ref, rms_norm, rms_norm_ref
from .rope import (RopeOwner, RopeTable, apply_rope_half_ref, apply_rope_interleaved, apply_rope_interleaved_ref,
                   rms_norm_rope_half, rms_norm_rope_half_ref, rope_cos_sin, yarn_inv_freq)
from .router import route, route_ref, router_logits, router_logits_ref
from .scan import row_cumsum, row_cumsum_ref
from .topk import topk_logprobs, topk_logprobs_ref
from . import gpu as _gpu

_gpu.register_all()  # NOTE: registers CUDA/Triton kernels only when CUDA is available

__all__ = [
    "draft_attention", "draft_attention_ref",
    "latent_write", "latent_write_ref", "move_rows", "move_rows_ref",
    "Linear", "linear", "linear_glu", "matmul_nt", "matmul_nt_glu", "matmul_nt_glu_ref", "matmul_nt_ref", "stack_weights",
    "rms_norm_linear", "rms_norm_linear_ref", "routed_glu", "routed_glu_ref", "linear_add", "linear_add_ref",
    "mla_attention", "mla_attention_ref", "mla_attention_naive_ref",
    "moe_experts", "moe_experts_dense", "moe_experts_ref",
    "add_rms_norm", "add_rms_norm_ref", "rms_norm", "rms_norm_ref",
    "apply_rope_interleaved", "apply_rope_interleaved_ref", "apply_rope_half_ref",
    "rms_norm_rope_half", "rms_norm_rope_half_ref", "RopeOwner", "RopeTable", "rope_cos_sin", "yarn_inv_freq",
    "route", "route_ref", "router_logits", "router_logits_ref",
    "row_cumsum", "row_cumsum_ref",
    "topk_logprobs", "topk_logprobs_ref",
]
