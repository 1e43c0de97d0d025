"""ops.latent_write in one Triton launch: one program per token reads its kv_a row once, normalises the
c_kv part, ropes the k_pe part (float32 math, one rounding each) and stores both at the token's cache slot
(read from device memory under graphs, so the slot is no host value baked into a recording). And
ops.move_rows in one launch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl
from .pdl import wait_previous
from .triton_rope import table_rows


@triton.jit(do_not_specialize=["slot0", "skv", "sc", "sp", "s_cs"])
def _latent_kernel(KV, W, COS, SIN, CKV, KPE, SLOTS, slot0, skv, sc, sp, s_cs, eps, R: tl.constexpr,
                   HALF: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr, HAS_SLOTS: tl.constexpr,
                   PDL: tl.constexpr = False):
    wait_previous(PDL)
    t = tl.program_id(0)
    if HAS_SLOTS:
        dst = tl.load(SLOTS + t).to(tl.int64)
    else:
        dst = (slot0 + t).to(tl.int64)
    row = KV + t.to(tl.int64) * skv
    i = tl.arange(0, BLOCK_R)
    x = tl.load(row + i, mask=i < R, other=0.0).to(tl.float32)
    inv = tl.rsqrt(tl.sum(x * x, 0) / R + eps)
    w = tl.load(W + i, mask=i < R, other=0.0).to(tl.float32)
    tl.store(CKV + dst * sc + i, (x * inv * w).to(CKV.dtype.element_ty), mask=i < R)
    j = tl.arange(0, BLOCK_H)
    ok = j < HALF
    x1 = tl.load(row + R + 2 * j, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(row + R + 2 * j + 1, mask=ok, other=0.0).to(tl.float32)
    c = tl.load(COS + t * s_cs + j, mask=ok, other=0.0).to(tl.float32)
    s = tl.load(SIN + t * s_cs + j, mask=ok, other=0.0).to(tl.float32)
    out = KPE + dst * sp
    tl.store(out + 2 * j, (x1 * c - x2 * s).to(KPE.dtype.element_ty), mask=ok)
    tl.store(out + 2 * j + 1, (x2 * c + x1 * s).to(KPE.dtype.element_ty), mask=ok)


def latent_write_triton(kv, weight, eps, cos, sin, ckv_buf, kpe_buf, where):
    """ops.latent_write for one sequence (kv [T, r + p], buffers [S, *]); None for what it does not serve."""
    r = weight.shape[0] if weight.dim() == 1 else -1
    if kv.dim() != 2 or ckv_buf.dim() != 2 or kpe_buf.dim() != 2 or r < 1:
        return None
    t, p = kv.shape[0], kv.shape[1] - r
    if p < 2 or p % 2 or ckv_buf.shape[1] != r or kpe_buf.shape[1] != p or cos.shape != (t, p // 2) \
            or sin.shape != cos.shape or any(x.stride(-1) != 1 for x in (kv, ckv_buf, kpe_buf)):
        return None
    slots = where if torch.is_tensor(where) else None
    if slots is not None and (slots.shape != (t,) or slots.dtype != torch.int64):
        return None
    if t:
        cos, sin, s_cs = table_rows(cos, sin)
        _latent_kernel[(t,)](
            kv, weight.contiguous(), cos, sin, ckv_buf, kpe_buf,
            slots if slots is not None else kv, 0 if slots is not None else int(where),
            kv.stride(0), ckv_buf.stride(0), kpe_buf.stride(0), s_cs, float(eps), R=r, HALF=p // 2,
            BLOCK_R=triton.next_power_of_2(r), BLOCK_H=triton.next_power_of_2(p // 2),
            HAS_SLOTS=slots is not None, num_warps=4 if r >= 256 else 1, **pdl.launch(kv.device))
    return ckv_buf, kpe_buf


@triton.jit(do_not_specialize=["n", "s_cl", "s_cs", "s_pl", "s_ps"])
def _move_kernel(CKV, KPE, SRC, DST, n, s_cl, s_cs, s_pl, s_ps, R: tl.constexpr, P: tl.constexpr,
                 BLOCK: tl.constexpr):
    # one program per (layer, block of the r + p columns); the rows in order (move_rows' condition)
    layer, col = tl.program_id(0).to(tl.int64), tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_c, in_p = col < R, (col >= R) & (col < R + P)
    for k in range(n):
        s, d = tl.load(SRC + k).to(tl.int64), tl.load(DST + k).to(tl.int64)
        c = tl.load(CKV + layer * s_cl + s * s_cs + col, mask=in_c)
        q = tl.load(KPE + layer * s_pl + s * s_ps + (col - R), mask=in_p)
        tl.store(CKV + layer * s_cl + d * s_cs + col, c, mask=in_c)
        tl.store(KPE + layer * s_pl + d * s_ps + (col - R), q, mask=in_p)


def move_rows_triton(ckv, kpe, src, dst):
    """ops.move_rows; None for layouts it does not serve."""
    if ckv.dim() != 3 or kpe.dim() != 3 or ckv.shape[:2] != kpe.shape[:2] or ckv.dtype != kpe.dtype \
            or ckv.stride(-1) != 1 or kpe.stride(-1) != 1 or src.shape != dst.shape or src.dim() != 1:
        return None
    r, p, block = ckv.shape[-1], kpe.shape[-1], 128
    if src.numel():
        _move_kernel[(ckv.shape[0], triton.cdiv(r + p, block))](
            ckv, kpe, src, dst, src.numel(), ckv.stride(0), ckv.stride(1), kpe.stride(0), kpe.stride(1),
            R=r, P=p, BLOCK=block)
    return True
