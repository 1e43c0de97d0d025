"""RMSNorm (+ residual add) of wide rows in Triton: one program per row holds the whole row in registers
(one read, one write). The CUDA kernel (csrc/small_ops.cu) stages the row in shared memory and measured
slower for K2.6's 7168-wide rows (BENCHMARKS.md history); it keeps the narrow rows."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl
from .layout import row_layout
from .pdl import wait_previous

MIN_D = 1024  # narrower rows stay on the CUDA kernel (faster there: the demo's 256)


@triton.jit(do_not_specialize=["inner", "s_outer", "s_inner"])
def _norm_kernel(X, RES, W, Y, RES_OUT, inner, s_outer, s_inner, eps, D: tl.constexpr, BLOCK: tl.constexpr,
                 HAS_RES: tl.constexpr, PDL: tl.constexpr = False):
    wait_previous(PDL)
    r = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK)
    ok = i < D
    x = tl.load(X + (r // inner) * s_outer + (r % inner) * s_inner + i, mask=ok, other=0.0)
    if HAS_RES:  # NOTE: like the reference, the sum is rounded to the activation dtype before the norm
        x = (x.to(tl.float32) + tl.load(RES + r * D + i, mask=ok, other=0.0).to(tl.float32)).to(X.dtype.element_ty)
        tl.store(RES_OUT + r * D + i, x, mask=ok)
    xf = x.to(tl.float32)
    inv = tl.rsqrt(tl.sum(xf * xf, 0) / D + eps)
    w = tl.load(W + i, mask=ok, other=0.0).to(tl.float32)
    tl.store(Y + r * D + i, (xf * inv * w).to(Y.dtype.element_ty), mask=ok)


def rms_norm_triton(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    """(rms_norm(x [+ residual]), x + residual or None), outputs contiguous; x read in place
    (layout.row_layout). None for what it does not serve."""
    d = x.shape[-1]
    layout = row_layout(x)
    if layout is None or weight.shape != (d,) or (residual is not None and residual.shape != x.shape):
        return None
    rows, inner, s_outer, s_inner = layout
    res = residual.contiguous() if residual is not None else None
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(y) if residual is not None else None
    if rows:
        block = triton.next_power_of_2(d)
        _norm_kernel[(rows,)](x, res if res is not None else y, weight.contiguous(), y,
                              res_out if res_out is not None else y, inner, s_outer, s_inner, float(eps), D=d,
                              BLOCK=block, HAS_RES=residual is not None, num_warps=min(16, max(1, block // 512)),
                              **pdl.launch(x.device))
    return y, res_out


def wide(x: torch.Tensor, *_) -> bool:
    """Rows this kernel takes ahead of the CUDA kernel (ops/gpu.py's supports for both norms)."""
    return x.shape[-1] >= MIN_D


def rms_norm_wide(x: torch.Tensor, weight: torch.Tensor, eps: float):
    """ops.rms_norm's kernel for rows >= MIN_D wide; None for narrower rows (the CUDA kernel behind it)."""
    out = rms_norm_triton(x, None, weight, eps) if x.shape[-1] >= MIN_D else None
    return out[0] if out is not None else None


def add_rms_norm_wide(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """ops.add_rms_norm's kernel for rows >= MIN_D wide; None for narrower rows."""
    return rms_norm_triton(x, residual, weight, eps) if x.shape[-1] >= MIN_D else None
