"""ops.latent_write in one Triton launch: one program per token reads its kv_a row once, normalises the
c_kv part, ropes the k_pe part (float32 math, one rounding each) and stores both at the token's cache slot
(read from device memory under graphs, so the slot is no host value baked into a recording)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["slot0", "skv", "sc", "sp"])
def _latent_kernel(KV, W, COS, SIN, CKV, KPE, SLOTS, slot0, skv, sc, sp, eps, R: tl.constexpr,
                   HALF: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr, HAS_SLOTS: tl.constexpr):
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
    c = tl.load(COS + t * HALF + j, mask=ok, other=0.0).to(tl.float32)
    s = tl.load(SIN + t * HALF + j, mask=ok, other=0.0).to(tl.float32)
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
        _latent_kernel[(t,)](
            kv, weight.contiguous(), cos.contiguous(), sin.contiguous(), ckv_buf, kpe_buf,
            slots if slots is not None else kv, 0 if slots is not None else int(where),
            kv.stride(0), ckv_buf.stride(0), kpe_buf.stride(0), float(eps), R=r, HALF=p // 2,
            BLOCK_R=triton.next_power_of_2(r), BLOCK_H=triton.next_power_of_2(p // 2),
            HAS_SLOTS=slots is not None, num_warps=4 if r >= 256 else 1)
    return ckv_buf, kpe_buf
