"""Registers the CUDA / Triton kernels when CUDA is usable. Imported by ops/__init__.py; a no-op on CPU.

The CUDA library is built on first use (ops/build.py); if that fails (no nvcc, compile error), each op
logs one warning and keeps using its reference; so does a Triton kernel that does not compile or fit on
this GPU. DDTREE_KERNELS=0 disables every fast kernel."""

from __future__ import annotations

import logging
import os

import torch

from . import registry
from .registry import register

log = logging.getLogger(__name__)
enabled_ops: list[str] = []


def fingerprint() -> str:
    """The registered kernels and the sources they come from (ops/*.py, csrc/*.cu), hashed: what a cached
    measurement of their speed is valid for."""
    import hashlib
    from pathlib import Path

    h = hashlib.sha1(",".join(sorted(enabled_ops)).encode())
    here = Path(__file__).resolve().parent
    for f in sorted(here.glob("*.py")) + sorted((here.parents[1] / "csrc").glob("*.cu")):
        h.update(f.read_bytes())
    return h.hexdigest()[:10]


def _guard(name, fast_fn, ref_fn, errors=None):
    """fast_fn, or ref_fn from its first failure on: a CUDA library that does not build, or (Triton) a
    kernel that does not compile or fit on this GPU (e.g. shared memory on sm_120); logged once."""
    if errors is None:
        from .build import KernelBuildError as errors
    broken = []

    def fn(*args, **kw):
        if not broken:
            try:
                return fast_fn(*args, **kw)
            except errors as e:
                broken.append(e)
                log.warning("%s: fast kernel unavailable (%s); using the reference", name, str(e).splitlines()[0][:200])
        return ref_fn(*args, **kw)

    fn.__name__ = f"{name}_fast"
    return fn


def _enable(name: str, fn, dtypes=None, ahead: bool = False) -> None:
    register(name, fn, dtypes, ahead)
    if name not in enabled_ops:
        enabled_ops.append(name)


def register_all() -> list[str]:
    if enabled_ops or os.environ.get("DDTREE_KERNELS", "1") == "0" or not torch.cuda.is_available():
        return enabled_ops
    from . import cuda_moe, cuda_small
    from .moe import moe_experts_ref
    from .norm import add_rms_norm_ref, rms_norm_ref
    from .router import route_ref

    # NOTE: the INT4 MoE computes in bf16: float32 models keep the reference (dense) experts. Their other
    # GPU ops (below) round at float32 level, so the tree's tokens keep matching AR.
    half = (torch.bfloat16, torch.float16)
    _enable("moe_experts", _guard("moe_experts", cuda_moe.moe_experts_fast, moe_experts_ref), half)
    _enable("prepare_experts", cuda_moe.prepare_experts_fast, half)  # falls back internally
    _enable("route", _guard("route", cuda_small.route_fast, lambda lg, b, k, s, n=True: route_ref(lg, b, k, s, 1, 1, n)))
    _enable("rms_norm", _guard("rms_norm", cuda_small.rms_norm_fast, rms_norm_ref))
    _enable("add_rms_norm", _guard("add_rms_norm", cuda_small.rms_norm_residual_fast, add_rms_norm_ref))
    try:
        from . import (triton_draft_attention, triton_exact_linear, triton_latent, triton_linear, triton_mla,
                       triton_mla_exact, triton_norm, triton_rope, triton_topk, triton_tree)
    except Exception as e:  # no Triton (or a broken install): the reference attention stays
        log.info("Triton kernels (MLA and drafter attention, small-M products, rope, latent write, tree) unavailable: %s", e)
        return enabled_ops
    from triton.runtime.errors import TritonError

    from .mla_attention import mla_attention_ref

    def triton_op(name, fast_fn, dtypes=None, ahead=False):
        """After a failure for good it returns None: the op's next kernel or its reference serves (dispatch)."""
        _enable(name, _guard(name, fast_fn, lambda *a: None, TritonError), dtypes, ahead)

    exact = registry.exact()
    mla_kernel = _guard("mla_attention", triton_mla.mla_attention_triton, mla_attention_ref, TritonError)
    mla_exact = _guard("mla_attention", triton_mla_exact.mla_attention_exact, lambda *a: None, TritonError)

    def mla(q_lat, q_pe, ckv, kpe, prefix_len, tree_mask, scale):
        # NOTE: the row-invariant kernel serves every call (direct or recorded, any dtype): a query must
        # round the same in every round. Without it, float32 eager forwards keep the reference.
        out = mla_exact(q_lat, q_pe, ckv, kpe, prefix_len, tree_mask, scale) if exact else None
        if out is not None:
            return out
        if q_lat.dtype == torch.float32 and not torch.is_tensor(prefix_len):
            return mla_attention_ref(q_lat, q_pe, ckv, kpe, prefix_len, tree_mask, scale)
        return mla_kernel(q_lat, q_pe, ckv, kpe, prefix_len, tree_mask, scale)

    _enable("mla_attention", mla, half + (torch.float32,))
    # NOTE: float32 only: cuBLAS's tensor-core kernels serve bf16 well; its float32 picks for small M do not
    triton_op("matmul_nt", triton_linear.matmul_nt_fast, (torch.float32,))
    triton_op("matmul_nt_glu", triton_linear.matmul_nt_glu_fast, (torch.float32,))
    triton_op("rms_norm_linear", triton_linear.rms_norm_linear_fast, (torch.float32,))
    triton_op("routed_glu", triton_linear.routed_glu_fast, (torch.float32,))
    # NOTE: bf16 takes cuBLAS's addmm (one launch instead of a product and an add)
    triton_op("linear_add", triton_linear.linear_add_fast, half + (torch.float32,))
    if exact:  # NOTE: row-invariant half-precision products at every M (ahead of cuBLAS, also in prefills)
        triton_op("matmul_nt", triton_exact_linear.matmul_nt_exact, half, ahead=True)
        triton_op("matmul_nt_glu", triton_exact_linear.matmul_nt_glu_exact, half, ahead=True)
        triton_op("linear_add", triton_exact_linear.linear_add_exact, half, ahead=True)
        triton_op("router_logits", lambda x, w: triton_exact_linear.matmul_nt_exact(x.float(), w.float()))
    triton_op("build_tree", triton_tree.build_tree_triton, (torch.float32,))
    triton_op("rope", triton_rope.rope_triton, half + (torch.float32,))
    triton_op("norm_rope", lambda x, w, eps, cos, sin: triton_rope.rope_triton(x, cos, sin, True, False, w, eps),
              half + (torch.float32,))
    triton_op("latent_write", triton_latent.latent_write_triton, half + (torch.float32,))
    triton_op("move_rows", triton_latent.move_rows_triton)
    # wide rows (K2.6's 7168 hidden, 1536 q_a) take the Triton norm, ahead of the CUDA kernel (narrow rows)
    triton_op("rms_norm", triton_norm.rms_norm_wide, ahead=True)
    triton_op("add_rms_norm", triton_norm.add_rms_norm_wide, ahead=True)
    triton_op("draft_attention", triton_draft_attention.draft_attention_triton, half + (torch.float32,))
    triton_op("ancestor_mask", triton_tree.ancestor_mask_triton)
    triton_op("walk", triton_tree.walk_triton)
    triton_op("walk_commit", triton_tree.walk_commit_triton)
    triton_op("pack_round", triton_tree.pack_round_triton)
    triton_op("topk_logprobs", triton_topk.topk_logprobs_triton)
    return enabled_ops
