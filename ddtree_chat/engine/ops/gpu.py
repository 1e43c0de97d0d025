"""Registers the CUDA / Triton kernels when CUDA is usable. Imported by ops/__init__.py; a no-op on CPU.

The CUDA library is built on first use (ops/build.py); if that fails (no nvcc, compile error), each op
logs one warning and keeps using its next kernel or its reference (registry.Op); so does a Triton kernel
that does not compile or fit on this GPU. DDTREE_KERNELS=0 disables every fast kernel."""

from __future__ import annotations

import logging
import os

import torch

from ... import knobs
from . import registry

log = logging.getLogger(__name__)
enabled_ops: list[str] = []


def fingerprint() -> str:
    """The registered kernels, the exactness knob that picks among them, and the sources they come from
    (ops/*.py, csrc/*.cu), hashed: what a cached measurement of their speed is valid for."""
    import hashlib
    from pathlib import Path

    h = hashlib.sha1(",".join(sorted(enabled_ops)).encode())
    h.update(b"exact" if registry.exact() else b"by-rows")
    h.update(knobs.mla_kernel().encode())
    here = Path(__file__).resolve().parent
    for f in sorted(here.glob("*.py")) + sorted((here.parents[1] / "csrc").glob("*.cu*")):
        h.update(f.read_bytes())
    return h.hexdigest()[:10]


def _enable(name: str, fn, dtypes=None, supports=None, ahead: bool = False, errors=(), declines: bool = False,
            kernel_name: str | None = None) -> None:
    registry.define(name).register(fn, dtypes, supports, ahead, errors, declines=declines, name=kernel_name)
    if name not in enabled_ops:
        enabled_ops.append(name)


def _int_prefix_fp32(q_lat, q_pe, ckv, kpe, prefix_len, tree_mask, scale) -> bool:
    return q_lat.dtype == torch.float32 and not torch.is_tensor(prefix_len)


def _mla_exact_shape(q_lat, q_pe, *_) -> bool:
    """Mirrors mla_attention_exact's own shape check (it returns None outside it)."""
    r = q_lat.shape[-1]
    return q_lat.dim() == 3 and r >= 64 and not r & (r - 1) and q_pe.shape[-1] in (16, 32, 64, 128)


def _exact_product_shape(x, w, residual=None, any_dtype: bool = False) -> bool:
    """Mirrors matmul_nt_exact's own checks (it returns None outside them); any_dtype: x is cast first."""
    if x.dim() > 3 or w.dim() > 3 or (w.dtype != x.dtype and not any_dtype) or w.shape[-1] != x.shape[-1] \
            or (x.dim() == 3 and w.dim() == 3 and x.shape[0] != w.shape[0]):
        return False
    return residual is None or (x.dim() == 2 and w.dim() == 2 and residual.shape == (x.shape[0], w.shape[0])
                                and residual.dtype == x.dtype and residual.stride(-1) == 1)


def register_all() -> list[str]:
    """Every CUDA / Triton kernel, in the order dispatch tries them; the rules that pick one are the
    dtypes and `supports` predicates here (registry.Op)."""
    if enabled_ops or os.environ.get("DDTREE_KERNELS", "1") == "0" or not torch.cuda.is_available():
        return enabled_ops
    from . import cuda_mla, cuda_moe, cuda_small
    from .build import KernelBuildError
    from .moe import _moe_reference
    from .router import router_through_products

    # NOTE: the INT4 MoE computes in bf16: float32 models keep the reference (dense) experts. Their other
    # GPU ops (below) round at float32 level, so the tree's tokens keep matching AR.
    half = (torch.bfloat16, torch.float16)
    built = (KernelBuildError,)
    packed = lambda x, ids, w, experts, residual: isinstance(experts, cuda_moe.PackedExperts)  # noqa: E731
    _enable("moe_experts", cuda_moe.moe_experts_fast, half, packed, errors=built)
    # NOTE: half-precision experts the library did not pack keep the grouped reference, not the dense form
    _enable("moe_experts", _moe_reference, half, lambda x, ids, w, experts, residual: not packed(x, ids, w, experts, residual),
            kernel_name="moe_experts_grouped")
    _enable("prepare_experts", cuda_moe.prepare_experts_fast, half, cuda_moe.can_pack_on_gpu, errors=built)
    _enable("route", cuda_small.route_kernel, supports=cuda_small.route_supported, errors=built)
    # NOTE: row-invariant by construction: where chosen it serves every bf16 call at K2.6's latent shape, exact
    # or not (a round and the AR step must take the same kernel)
    if knobs.mla_kernel() in ("cuda", "cuda-wide"):
        _enable("mla_attention", cuda_mla.mla_attention_cuda, (torch.bfloat16,), cuda_mla.supported, errors=built)
    _enable("rms_norm", cuda_small.rms_norm_fast, supports=cuda_small.norm_supported, errors=built)
    _enable("add_rms_norm", cuda_small.rms_norm_residual_fast, supports=cuda_small.add_norm_supported, errors=built)
    try:
        from . import (triton_draft_attention, triton_exact_linear, triton_latent, triton_linear, triton_mla,
                       triton_mla_exact, triton_norm, triton_rope, triton_scan, triton_topk, triton_tree)
    except Exception as e:  # no Triton (or a broken install): the reference attention stays
        log.info("Triton kernels (MLA and drafter attention, small-M products, rope, latent write, tree) unavailable: %s", e)
        return enabled_ops
    from triton.runtime.errors import TritonError

    def triton_op(name, fast_fn, dtypes=None, supports=None, ahead=False, declines=True):
        # NOTE: declines: these kernels still check some shapes themselves (None: the next kernel serves)
        _enable(name, fast_fn, dtypes, supports, ahead, (TritonError,), declines)

    exact = registry.exact()
    not_library = lambda *a: not registry.prefers_library()  # noqa: E731
    # NOTE: the row-invariant kernel serves every call (direct or recorded, any dtype): a query must round
    # the same in every round. Without it, float32 eager forwards (an int prefix length) keep the reference.
    if exact:
        triton_op("mla_attention", triton_mla_exact.mla_attention_exact, half + (torch.float32,), _mla_exact_shape)
    triton_op("mla_attention", triton_mla.mla_attention_triton, half + (torch.float32,),
              lambda *a: not _int_prefix_fp32(*a), declines=False)
    # NOTE: float32 only: cuBLAS's tensor-core kernels serve bf16 well; its float32 picks for small M do not;
    # none inside registry.prefer_library() (Python-launched forwards: the launch's host time)
    triton_op("matmul_nt", triton_linear.matmul_nt_fast, (torch.float32,), not_library)
    triton_op("matmul_nt_glu", triton_linear.matmul_nt_glu_fast, (torch.float32,), not_library)
    triton_op("rms_norm_linear", triton_linear.rms_norm_linear_fast, (torch.float32,), not_library)
    triton_op("routed_glu", triton_linear.routed_glu_fast, (torch.float32,), not_library)
    # NOTE: bf16 takes cuBLAS's addmm (one launch instead of a product and an add)
    triton_op("linear_add", triton_linear.linear_add_fast, half + (torch.float32,),
              lambda *a: triton_linear.linear_add_layout(*a) and not registry.prefers_library(), declines=False)
    triton_op("linear_add", triton_linear.linear_add_addmm, half + (torch.float32,), triton_linear.linear_add_layout,
              declines=False)
    if exact:  # NOTE: row-invariant half-precision products at every M (ahead of cuBLAS, also in prefills)
        triton_op("matmul_nt", triton_exact_linear.matmul_nt_exact, half, _exact_product_shape, ahead=True)
        triton_op("matmul_nt_glu", triton_exact_linear.matmul_nt_glu_exact, half,
                  lambda x, wg, wu: _exact_product_shape(x, wg) and _exact_product_shape(x, wu), ahead=True)
        triton_op("linear_add", triton_exact_linear.matmul_nt_exact, half, _exact_product_shape, ahead=True)
        triton_op("router_logits", triton_exact_linear.router_logits_exact,
                  supports=lambda x, w: _exact_product_shape(x, w, any_dtype=True))
    # NOTE: otherwise the router's float32 product takes the products' own dispatch (the small-M Triton
    # kernels), not cuBLAS's float32 picks, which cost a tree's verify extra launches in every MoE layer
    _enable("router_logits", router_through_products)
    triton_op("build_tree", triton_tree.build_tree_triton, (torch.float32,),
              lambda root, lp, ids, budget, out=None: triton_tree.fits(lp, budget), declines=False)
    triton_op("rope", triton_rope.rope_triton, half + (torch.float32,))
    triton_op("norm_rope", lambda x, w, eps, cos, sin: triton_rope.rope_triton(x, cos, sin, True, False, w, eps),
              half + (torch.float32,))
    triton_op("latent_write", triton_latent.latent_write_triton, half + (torch.float32,))
    triton_op("move_rows", triton_latent.move_rows_triton)
    # wide rows (K2.6's 7168 hidden, 1536 q_a) take the Triton norm, ahead of the CUDA kernel (narrow rows)
    triton_op("rms_norm", triton_norm.rms_norm_wide, supports=triton_norm.wide, ahead=True)
    triton_op("add_rms_norm", triton_norm.add_rms_norm_wide, supports=triton_norm.wide, ahead=True)
    triton_op("draft_attention", triton_draft_attention.draft_attention_triton, half + (torch.float32,))
    triton_op("ancestor_mask", triton_tree.ancestor_mask_triton)
    triton_op("walk", triton_tree.walk_triton)
    triton_op("walk_commit", triton_tree.walk_commit_triton, supports=triton_tree.commit_state_ok, declines=False)
    triton_op("pack_round", triton_tree.pack_round_triton, supports=triton_tree.pack_parts_ok, declines=False)
    triton_op("topk_logprobs", triton_topk.topk_logprobs_triton)
    triton_op("row_cumsum", triton_scan.row_cumsum_triton, (torch.float32,))
    return enabled_ops
