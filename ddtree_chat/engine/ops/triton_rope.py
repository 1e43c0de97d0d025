"""Rotary embedding in one Triton launch (the reference, ops/rope.py, is 7 elementwise torch ops per call:
two strided halves, four products, a sum, a difference and a stack/cat; x2 per attention layer, so ~15%
of a small model's verify kernels). Math in float32, one rounding to the output dtype.

x is read through its strides (the rope part of q or of the latent projection is a slice; so are the
drafter's q and k heads inside its fused q/k/v product: layout.row_layout), the output is contiguous like
the reference's. With a weight (NORM) each row is RMS-normalised first: the drafter's q_norm / k_norm and
rope in one launch instead of four (a per-head weight covers q's and k's heads, or every layer's k, at once)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl
from .layout import row_layout
from .pdl import wait_previous


@triton.jit(do_not_specialize=["R", "H", "T", "inner", "s_outer", "s_inner", "s_w", "s_cs"])
def _rope_kernel(X, COS, SIN, O, W, R, H, T, inner, s_outer, s_inner, s_w, s_cs, eps, HALF: tl.constexpr,
                 BLOCK_D: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK_R: tl.constexpr, NORM: tl.constexpr,
                 PDL: tl.constexpr = False):
    wait_previous(PDL)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    j = tl.arange(0, BLOCK_D)
    ok = (rows < R)[:, None] & (j < 2 * HALF)[None, :]
    t = (rows // H) % T  # NOTE: rows are [..., T, H] flattened (H = 1 without a heads axis)
    # NOTE: whole rows, read and written contiguously; each entry's rotation partner is a second read of
    # the same lines (strided half-row loads and stores were slower)
    if INTERLEAVED:  # pairs (x[2i], x[2i+1])
        partner, f = j ^ 1, j // 2
        first = j % 2 == 0
    else:  # NeoX halves (x[i], x[i + d/2])
        first = j < HALF
        partner, f = tl.where(first, j + HALF, j - HALF), j % HALF
    r64 = rows[:, None].to(tl.int64)
    xr = X + (r64 // inner) * s_outer + (r64 % inner) * s_inner
    x = tl.load(xr + j[None, :], mask=ok, other=0.0).to(tl.float32)
    xp = tl.load(xr + partner[None, :], mask=ok, other=0.0).to(tl.float32)
    if NORM:  # weight row (rows % H) * s_w: s_w = 0 for one shared weight, d for one per head
        inv = tl.rsqrt(tl.sum(x * x, 1) / (2 * HALF) + eps)[:, None]
        wr = W + ((rows % H) * s_w)[:, None]
        x = x * inv * tl.load(wr + j[None, :], mask=ok, other=0.0).to(tl.float32)
        xp = xp * inv * tl.load(wr + partner[None, :], mask=ok, other=0.0).to(tl.float32)
    cs = t[:, None] * s_cs + f[None, :]
    c = tl.load(COS + cs, mask=ok, other=0.0).to(tl.float32)
    s = tl.load(SIN + cs, mask=ok, other=0.0).to(tl.float32)
    out = x * c + tl.where(first, -1.0, 1.0)[None, :] * xp * s
    tl.store(O + rows[:, None].to(tl.int64) * (2 * HALF) + j[None, :], out.to(O.dtype.element_ty), mask=ok)


def table_rows(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """cos, sin [T, d/2] as the kernels read them: (cos, sin, their row stride). Views of one rope table
    gather (RopeTable.cos_sin) pass as they are; other layouts are made contiguous."""
    if cos.stride(-1) != 1 or sin.stride() != cos.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    return cos, sin, cos.stride(0)


def rope_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: bool, interleaved: bool,
                weight: torch.Tensor | None = None, eps: float = 0.0):
    """x [..., T, d] (or [..., T, h, d] with heads=True), last axis unit-stride; cos/sin [T, d/2]; weight
    [d] (or [h, d], one per head): rms_norm(x, weight, eps) is what gets rotated. Returns None when x's rows
    cannot be addressed in place (layout.row_layout; the caller uses the reference)."""
    d = x.shape[-1]
    t = x.shape[-3] if heads else x.shape[-2]
    per_head = weight is not None and heads and weight.shape == (x.shape[-2], d)
    if x.stride(-1) != 1 or d % 2 or cos.shape != (t, d // 2) or sin.shape != cos.shape or \
            (weight is not None and weight.shape != (d,) and not per_head):
        return None
    layout = row_layout(x)
    if layout is None:
        return None
    r, inner, s_outer, s_inner = layout
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if r:
        block_d = triton.next_power_of_2(d)
        block_r = max(1, min(32, 2048 // block_d))
        cos, sin, s_cs = table_rows(cos, sin)
        _rope_kernel[(triton.cdiv(r, block_r),)](
            x, cos, sin, out, weight.contiguous() if weight is not None else out, r,
            x.shape[-2] if heads else 1, t, inner, s_outer, s_inner, d if per_head else 0, s_cs, float(eps), HALF=d // 2,
            BLOCK_D=block_d, INTERLEAVED=interleaved, BLOCK_R=block_r, NORM=weight is not None, **pdl.launch(x.device))
    return out
