"""Rotary embedding in one Triton launch (the reference, ops/rope.py, is 7 elementwise torch ops per call:
two strided halves, four products, a sum, a difference and a stack/cat; x2 per attention layer, so ~15%
of a small model's verify kernels). Math in float32, one rounding to the output dtype.

x is read through its row stride (the rope part of q or of the latent projection is a slice), the
output is contiguous like the reference's."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["R", "H", "T", "sxr"])
def _rope_kernel(X, COS, SIN, O, R, H, T, sxr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                 INTERLEAVED: tl.constexpr, BLOCK_R: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    i = tl.arange(0, BLOCK_H)
    ok = (rows < R)[:, None] & (i < HALF)[None, :]
    t = (rows // H) % T  # NOTE: rows are [..., T, H] flattened (H = 1 without a heads axis)
    if INTERLEAVED:  # pairs (x[2i], x[2i+1])
        a, b = 2 * i, 2 * i + 1
    else:  # NeoX halves (x[i], x[i + d/2])
        a, b = i, i + HALF
    xr = X + rows[:, None].to(tl.int64) * sxr
    x1 = tl.load(xr + a[None, :], mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(xr + b[None, :], mask=ok, other=0.0).to(tl.float32)
    cs = t[:, None] * HALF + i[None, :]
    c = tl.load(COS + cs, mask=ok, other=0.0).to(tl.float32)
    s = tl.load(SIN + cs, mask=ok, other=0.0).to(tl.float32)
    orow = O + rows[:, None].to(tl.int64) * (2 * HALF)
    tl.store(orow + a[None, :], (x1 * c - x2 * s).to(O.dtype.element_ty), mask=ok)
    tl.store(orow + b[None, :], (x2 * c + x1 * s).to(O.dtype.element_ty), mask=ok)


def rope_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: bool, interleaved: bool):
    """x [..., T, d] (or [..., T, h, d] with heads=True), last axis unit-stride; cos/sin [T, d/2].
    Returns None when x's rows cannot be read with one stride (the caller uses the reference)."""
    d = x.shape[-1]
    t = x.shape[-3] if heads else x.shape[-2]
    if x.stride(-1) != 1 or d % 2 or cos.shape != (t, d // 2) or sin.shape != cos.shape:
        return None
    try:
        rows = x.view(-1, d)  # NOTE: a view (no copy) exists iff the leading axes share one row stride
    except RuntimeError:
        return None
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    r = rows.shape[0]
    if r:
        block_h = triton.next_power_of_2(d // 2)
        block_r = max(1, min(64, 2048 // block_h))
        _rope_kernel[(triton.cdiv(r, block_r),)](
            rows, cos.contiguous(), sin.contiguous(), out, r, x.shape[-2] if heads else 1, t,
            rows.stride(0), HALF=d // 2, BLOCK_H=block_h, INTERLEAVED=interleaved,
            BLOCK_R=block_r)
    return out
