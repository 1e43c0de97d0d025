"""Rotary embedding in one Triton launch (the reference, ops/rope.py, is 7 elementwise torch ops per call:
two strided halves, four products, a sum, a difference and a stack/cat; x2 per attention layer, so ~15%
of a small model's verify kernels). Math in float32, one rounding to the output dtype.

x is read through its strides (the rope part of q or of the latent projection is a slice; so are the
drafter's q and k heads inside its fused q/k/v product: layout.row_layout), the output is contiguous like the reference's. With a weight (NORM) each row is RMS-normalised first: the
drafter's per-head q_norm / k_norm and rope in one launch instead of two."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .layout import row_layout


@triton.jit(do_not_specialize=["R", "H", "T", "inner", "s_outer", "s_inner"])
def _rope_kernel(X, COS, SIN, O, W, R, H, T, inner, s_outer, s_inner, eps, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                 INTERLEAVED: tl.constexpr, BLOCK_R: tl.constexpr, NORM: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    i = tl.arange(0, BLOCK_H)
    ok = (rows < R)[:, None] & (i < HALF)[None, :]
    t = (rows // H) % T  # NOTE: rows are [..., T, H] flattened (H = 1 without a heads axis)
    if INTERLEAVED:  # pairs (x[2i], x[2i+1])
        a, b = 2 * i, 2 * i + 1
    else:  # NeoX halves (x[i], x[i + d/2])
        a, b = i, i + HALF
    r64 = rows[:, None].to(tl.int64)
    xr = X + (r64 // inner) * s_outer + (r64 % inner) * s_inner
    x1 = tl.load(xr + a[None, :], mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(xr + b[None, :], mask=ok, other=0.0).to(tl.float32)
    if NORM:  # the row's d = 2 * HALF entries are exactly x1 and x2
        inv = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * HALF) + eps)[:, None]
        x1 = x1 * inv * tl.load(W + a, mask=i < HALF, other=0.0).to(tl.float32)[None, :]
        x2 = x2 * inv * tl.load(W + b, mask=i < HALF, other=0.0).to(tl.float32)[None, :]
    cs = t[:, None] * HALF + i[None, :]
    c = tl.load(COS + cs, mask=ok, other=0.0).to(tl.float32)
    s = tl.load(SIN + cs, mask=ok, other=0.0).to(tl.float32)
    orow = O + rows[:, None].to(tl.int64) * (2 * HALF)
    tl.store(orow + a[None, :], (x1 * c - x2 * s).to(O.dtype.element_ty), mask=ok)
    tl.store(orow + b[None, :], (x2 * c + x1 * s).to(O.dtype.element_ty), mask=ok)


def rope_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: bool, interleaved: bool,
                weight: torch.Tensor | None = None, eps: float = 0.0):
    """x [..., T, d] (or [..., T, h, d] with heads=True), last axis unit-stride; cos/sin [T, d/2]; weight
    [d]: rms_norm(x, weight, eps) is what gets rotated. Returns None when x's rows cannot be addressed in
    place (layout.row_layout; the caller uses the reference)."""
    d = x.shape[-1]
    t = x.shape[-3] if heads else x.shape[-2]
    if x.stride(-1) != 1 or d % 2 or cos.shape != (t, d // 2) or sin.shape != cos.shape or \
            (weight is not None and weight.shape != (d,)):
        return None
    layout = row_layout(x)
    if layout is None:
        return None
    r, inner, s_outer, s_inner = layout
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if r:
        block_h = triton.next_power_of_2(d // 2)
        block_r = max(1, min(64, 2048 // block_h))
        _rope_kernel[(triton.cdiv(r, block_r),)](
            x, cos.contiguous(), sin.contiguous(), out, weight.contiguous() if weight is not None else out, r,
            x.shape[-2] if heads else 1, t, inner, s_outer, s_inner, float(eps), HALF=d // 2, BLOCK_H=block_h,
            INTERLEAVED=interleaved, BLOCK_R=block_r, NORM=weight is not None)
    return out
