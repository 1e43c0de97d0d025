"""Small-M float32 products y = x @ w^T in Triton: one K loop per output tile, tensor-core dots in
3xTF32 (split operands, float32-level error: ~2-3e-7 relative on an H200, as cuBLAS's FFMA kernels).

Why: for the 16-257 row products of a tree verify (K, N of a few hundred), cuBLAS picks split-K kernels
(a memset, a 'largek' GEMM and a scaling pass: ~12-15 us for [33, 256] x [256, 128] on an H200), a
launch-latency-bound cost repeated ~100 times per round; this kernel takes 4-6 us there. Batched (one
batch per grid row) with arbitrary strides, so the MLA absorption and the dense experts use it too.
Where cuBLAS wins (measured: benchmarks/kernels.py --only linear) matmul_nt_fast keeps it.

GLU=True computes silu(x @ wg^T) * (x @ wu^T) in one launch (a SwiGLU MLP's gate/up half: four kernels
under cuBLAS - two products, the SiLU, the product - for any row count)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_M = 512  # prefill-sized products stay on cuBLAS (this kernel was measured up to 257 rows)
MIN_M = 16  # below, cuBLAS's small-M kernels are as fast or faster (except against a wide N)
MAX_K = 512  # a long K loop (the drafter's 1536-wide MLP) is slower here than cuBLAS's split-K
WIDE_N = 4096  # lm-head-wide products: this kernel wins from 2 rows


def _tile(m: int, n: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) by shape, not autotuned: each autotune config was one more
    compile per tile height, GLU flag and argument specialisation (150 binaries of this kernel in one GPU
    run's cache, a large part of a first start's compiles). Measured (kernels.py --only tiles, H200): 16x32
    tiles are fastest for every N < 2048 at 8-65 rows (more programs: a tile's K loop is the latency), e.g.
    [33, 256] x [128, 256] 4.0 us vs 5.8 with 64x32; taller and wider tiles win only for the lm head."""
    if n >= 2048 and m > 16:
        return min(64, triton.next_power_of_2(m)), 64, 64, 4, 2
    return 16, 32, 64, 4, 3


@triton.jit(do_not_specialize=["M"])
def _mm_nt_kernel(X, W, W2, O, M, N, K, BATCH, sxb, sxm, sxk, swb, swn, swk, sob, som, son,
                  PREC: tl.constexpr, GLU: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok, n_ok = offs_m < M, offs_n < N
    xp = X + b * sxb + offs_m[:, None] * sxm + offs_k[None, :] * sxk  # [BM, BK]
    w_off = b * swb + offs_n[None, :] * swn + offs_k[:, None] * swk  # [BK, BN]; W2 shares W's strides
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k + k0 < K
        x = tl.load(xp, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w_ok = k_ok[:, None] & n_ok[None, :]
        acc = tl.dot(x, tl.load(W + w_off, mask=w_ok, other=0.0), acc, input_precision=PREC)
        if GLU:
            acc2 = tl.dot(x, tl.load(W2 + w_off, mask=w_ok, other=0.0), acc2, input_precision=PREC)
        xp += BLOCK_K * sxk
        w_off += BLOCK_K * swk
    if GLU:
        acc = acc / (1.0 + tl.exp(-acc)) * acc2  # silu(gate) * up
    op = O + b * sob + offs_m[:, None] * som + offs_n[None, :] * son
    tl.store(op, acc, mask=m_ok[:, None] & n_ok[None, :])


def _as3(t: torch.Tensor, batch: int) -> tuple[torch.Tensor, int]:
    """t [R, C] or [B, R, C] -> ([B, R, C] view, its batch stride; 0 for a shared 2-D operand)."""
    if t.dim() == 2:
        return t.unsqueeze(0).expand(batch, *t.shape), 0
    return t, t.stride(0)


def _fits(x: torch.Tensor, w: torch.Tensor) -> bool:
    k = x.shape[-1]
    return (w.dtype == x.dtype and w.shape[-1] == k and x.shape[-2] <= MAX_M and k <= MAX_K
            and not (x.dim() == 3 and w.dim() == 3 and x.shape[0] != w.shape[0]))


def matmul_nt_fast(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The registered op: this kernel where it measured faster than cuBLAS, else torch.matmul."""
    m = x.shape[-2]
    if _fits(x, w) and (MIN_M <= m or (m >= 2 and w.shape[-2] >= WIDE_N)):
        return matmul_nt_triton(x, w)
    return torch.matmul(x, w.transpose(-1, -2))  # also words shape errors as torch does


def matmul_nt_glu_fast(x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor) -> torch.Tensor:
    """The registered GLU op: one launch at any row count this kernel serves, else two products + SiLU."""
    if _fits(x, wg) and wu.shape == wg.shape and wu.stride() == wg.stride() and wu.dtype == wg.dtype:
        return matmul_nt_triton(x, wg, w2=wu)
    return torch.nn.functional.silu(matmul_nt_fast(x, wg)) * matmul_nt_fast(x, wu)


def matmul_nt_triton(x: torch.Tensor, w: torch.Tensor, precision: str = "tf32x3",
                     w2: torch.Tensor | None = None, tile: tuple[int, ...] | None = None) -> torch.Tensor:
    """x [M, K] or [B, M, K], w [N, K] or [B, N, K] (any strides, float32, CUDA) -> [M, N] or [B, M, N].
    precision: tl.dot's input_precision ("ieee": FFMA dots, slower). w2 (w's shape and strides): the
    output is silu(x @ w^T) * (x @ w2^T). tile: (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) instead of
    the shape rule (kernels.py --only tiles sweeps them)."""
    batch = max(x.shape[0] if x.dim() == 3 else 1, w.shape[0] if w.dim() == 3 else 1)
    m, k = x.shape[-2:]
    n = w.shape[-2]
    x3, sxb = _as3(x, batch)
    w3, swb = _as3(w, batch)
    out = torch.empty(batch, m, n, dtype=torch.float32, device=x.device)
    block_m, block_n, block_k, warps, stages = tile or _tile(m, n)
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m), batch)
    w2_3 = _as3(w2, batch)[0] if w2 is not None else w3
    _mm_nt_kernel[grid](x3, w3, w2_3, out, m, n, k, batch, sxb, x3.stride(1), x3.stride(2), swb, w3.stride(1),
                        w3.stride(2), out.stride(0), out.stride(1), out.stride(2), PREC=precision,
                        GLU=w2 is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
                        num_stages=stages)
    return out if x.dim() == 3 or w.dim() == 3 else out[0]
