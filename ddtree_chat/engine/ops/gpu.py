"""Registers the CUDA / Triton kernels when CUDA is usable. Imported by ops/__init__.py; a no-op on CPU.

The CUDA library is built on first use (ops/build.py); if that fails (no nvcc, compile error), each op
logs one warning and keeps using its reference. DDTREE_KERNELS=0 disables every fast kernel."""

from __future__ import annotations

import logging
import os

import torch

from .registry import register

log = logging.getLogger(__name__)
_WARNED: set[str] = set()
enabled_ops: list[str] = []


def _guard(name, fast_fn, ref_fn):
    from .build import KernelBuildError

    def fn(*args, **kw):
        try:
            return fast_fn(*args, **kw)
        except KernelBuildError as e:
            if name not in _WARNED:
                _WARNED.add(name)
                log.warning("%s: fast kernel unavailable (%s); using the reference", name, e)
            return ref_fn(*args, **kw)

    fn.__name__ = f"{name}_fast"
    return fn


def register_all() -> list[str]:
    if enabled_ops or os.environ.get("DDTREE_KERNELS", "1") == "0" or not torch.cuda.is_available():
        return enabled_ops
    from . import cuda_moe, cuda_small
    from .moe import moe_experts_ref
    from .norm import rms_norm_ref
    from .router import route_ref

    # NOTE: the INT4 MoE computes in bf16: float32 models keep the reference (dense) experts. Their other
    # GPU ops (below) round at float32 level, so the tree's tokens keep matching AR.
    half = (torch.bfloat16, torch.float16)
    register("moe_experts", _guard("moe_experts", cuda_moe.moe_experts_fast, moe_experts_ref), half)
    register("prepare_experts", cuda_moe.prepare_experts_fast, half)  # falls back internally
    register("route", _guard("route", cuda_small.route_fast,
                             lambda lg, b, k, s, n=True: route_ref(lg, b, k, s, 1, 1, n)))
    register("rms_norm", _guard("rms_norm", cuda_small.rms_norm_fast, rms_norm_ref))
    register("add_rms_norm", _guard("add_rms_norm", cuda_small.rms_norm_residual_fast,
                                    lambda x, r, w, eps: (rms_norm_ref(x + r, w, eps), x + r)))
    enabled_ops.extend(["moe_experts", "prepare_experts", "route", "rms_norm", "add_rms_norm"])
    try:
        from . import triton_linear, triton_mla, triton_rope, triton_tree
    except Exception as e:  # no Triton (or a broken install): the reference attention stays
        log.info("Triton kernels (MLA attention, small-M products, rope, tree build) unavailable: %s", e)
    else:
        from .mla_attention import mla_attention_ref

        def mla(q_lat, q_pe, ckv, kpe, prefix_len, tree_mask, scale):
            # NOTE: float32 eager forwards keep the exact reference; a device length (static shapes, CUDA
            # graphs) needs the kernel, which then computes with IEEE float32 dots.
            if q_lat.dtype == torch.float32 and not torch.is_tensor(prefix_len):
                return mla_attention_ref(q_lat, q_pe, ckv, kpe, prefix_len, tree_mask, scale)
            return triton_mla.mla_attention_triton(q_lat, q_pe, ckv, kpe, prefix_len, tree_mask, scale)

        register("mla_attention", mla, half + (torch.float32,))
        # NOTE: float32 only: cuBLAS's tensor-core kernels serve bf16 well; its float32 picks for small M do not
        register("matmul_nt", triton_linear.matmul_nt_fast, (torch.float32,))
        register("matmul_nt_glu", triton_linear.matmul_nt_glu_fast, (torch.float32,))
        register("build_tree", triton_tree.build_tree_triton, (torch.float32,))
        register("ancestor_mask", triton_tree.ancestor_mask_triton)
        register("walk", triton_tree.walk_triton)
        register("rope", triton_rope.rope_triton, half + (torch.float32,))
        enabled_ops.extend(["mla_attention", "matmul_nt", "matmul_nt_glu", "build_tree", "ancestor_mask", "walk", "rope"])
    return enabled_ops
