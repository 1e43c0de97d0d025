"""Row-invariant products y = x @ w^T (Triton): every output row is computed by the same sequence of
floating-point operations whatever the number of rows M, so a tree verify's row equals the AR step's
(docs/exactness.md). Library GEMMs choose kernels and split-K by M; here the tile (BLOCK_M rows, BLOCK_N,
BLOCK_K, warps, stages: TILES) and the split of K depend only on (N, K, batch, dtype) and the device, and split-K
partials are added in split order by the tile's last split (triton_linear's kernel, SPLIT > 1). Only BLOCK_M
follows M (block_m): a half-precision MMA gives each row the same bits whatever the rows beside it (mma.sync at 16
and 32 rows, Hopper's wgmma at 64: test_exact_gpu; kernels.py --only exact_block_m).

Serves the half-precision target's dense products (attention projections and absorption, shared expert,
dense MLP, lm head; any M, also inside registry.prefer_library()) and the router's float32 logits
(router_logits_exact)."""

from __future__ import annotations

import torch
import triton

from . import pdl
from .router import float32_weight
from .triton_linear import _as3, _locks, _mm_nt_kernel
from .triton_mla import sm_count

WAVES = 2  # programs per SM the split aims at for one row block (the AR step's bandwidth)
MIN_SPLIT_STEPS = 4  # k-steps per split at least

# A tile: (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, split multiplier); its BLOCK_M is the one for up to 16 rows
# (the AR step's), block_m() takes taller blocks for more rows. The sweep (benchmarks/kernels.py --only exact)
# prints the winner per shape.
DEFAULT_TILE = (16, 64, 64, 4, 4, 1.0)
# float32 products (a float32 gate's router logits): FFMAs over a 16 x 256 x 4 broadcast per k-step (_mac's "fma"),
# 16 rows whatever M
FP32_TILE = (16, 4, 256, 8, 1, 1.0)
# (N, K) of a half-precision product -> its tile where the sweep measured one better than DEFAULT_TILE: K2.6's
# shapes at TP=1, its rule (kernels.exact_winners: the AR step first) and run in BENCHMARKS.md
TILES: dict[tuple[int, int], tuple[int, int, int, int, int, float]] = {
    (2112, 7168): (32, 64, 64, 4, 4, 1.0),  # fused q_a + kv_a
    (12288, 1536): (16, 64, 64, 4, 4, 0.5),  # q_b
    (7168, 8192): (16, 64, 64, 4, 4, 0.5),  # o_proj
    (2048, 7168): (16, 64, 64, 4, 4, 0.5),  # shared expert gate / up
    (7168, 2048): (16, 64, 64, 4, 4, 0.5),  # shared expert down
    (18432, 7168): (16, 64, 64, 4, 4, 1.0),  # dense MLP gate / up
    (7168, 18432): (16, 64, 64, 4, 4, 1.0),  # dense MLP down
    (163840, 7168): (16, 64, 128, 4, 3, 1.0),  # lm head
    # a TP=8 rank's shares (kernels.py --only exact_tp8); its dense MLP up (2304, 7168) keeps DEFAULT_TILE
    (1536, 1536): (16, 64, 64, 4, 4, 0.5),  # q_b / 8
    (7168, 1024): (16, 64, 128, 4, 3, 1.0),  # o_proj / 8
    (256, 7168): (16, 64, 128, 4, 3, 1.0),  # shared expert gate / up / 8
    (7168, 256): (64, 64, 128, 4, 3, 1.0),  # shared expert down / 8
    (7168, 2304): (16, 64, 128, 4, 3, 1.0),  # dense MLP down / 8
    (20480, 7168): (64, 128, 64, 4, 3, 1.0),  # lm head / 8
}


NARROW_N = 2304  # up to this many columns 65 rows keep 32-row blocks: 64-row ones leave too few programs


def block_m(bm: int, n: int, m: int) -> int:
    """BLOCK_M for m rows of an N-column half-precision product whose table tile has bm: that up to 16 rows, 32
    up to 32 rows (or N <= NARROW_N), else 64 (kernels.py --only exact_block_m's times at 1 / 17 / 65 rows)."""
    return bm if m <= 16 else max(bm, 32) if m <= 32 or n <= NARROW_N else 64


def tile(n: int, k: int, batch: int, dtype: torch.dtype, device, m: int = 1) -> tuple[int, int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, split) from the shape and the device; BLOCK_M also from the row
    count (half precision only: the float32 form's sums are laid out by the block)."""
    bm, bn, bk, warps, stages, mult = FP32_TILE if dtype == torch.float32 else TILES.get((n, k), DEFAULT_TILE)
    bm = bm if dtype == torch.float32 else block_m(bm, n, m)
    tiles = triton.cdiv(n, bn) * batch
    want = triton.next_power_of_2(triton.cdiv(WAVES * sm_count(device), tiles))
    split = min(max(1, int(want * mult)), max(1, k // (bk * MIN_SPLIT_STEPS)))
    return bm, bn, bk, warps, stages, split


def matmul_nt_exact(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor | None = None,
                    out_dtype: torch.dtype | None = None, w2: torch.Tensor | None = None) -> torch.Tensor | None:
    """x [M, K] or [B, M, K], w [N, K] or [B, N, K] (any strides, CUDA) -> out_dtype (default x.dtype) [M, N] or
    [B, M, N]; residual [M, N] (2-D only): added in float32 before the one rounding; w2 (w's shape and strides):
    the output is silu(x @ w^T) * (x @ w2^T), in float32 before the one rounding. None for what it does not
    serve."""
    if x.dim() > 3 or w.dim() > 3 or w.dtype != x.dtype or w.shape[-1] != x.shape[-1] \
            or (x.dim() == 3 and w.dim() == 3 and x.shape[0] != w.shape[0]):
        return None
    if w2 is not None and (residual is not None or w2.shape != w.shape or w2.stride() != w.stride()
                           or w2.dtype != w.dtype):
        return None
    if residual is not None and (x.dim() != 2 or w.dim() != 2 or residual.shape != (x.shape[0], w.shape[0])
                                 or residual.dtype != x.dtype or residual.stride(-1) != 1):
        return None
    batch = max(x.shape[0] if x.dim() == 3 else 1, w.shape[0] if w.dim() == 3 else 1)
    m, k = x.shape[-2:]
    n = w.shape[-2]
    x3, sxb = _as3(x, batch)
    w3, swb = _as3(w, batch)
    w2_3 = _as3(w2, batch)[0] if w2 is not None else w3  # NOTE: w's shape and strides (checked above)
    # NOTE: a head-transposed x ([B, M, K] view of [M, B, K]: the MLA absorption's) gets its output in that
    # layout too, so transposing it back is contiguous
    if x.dim() == 3 and batch > 1 and x.stride(0) < x.stride(1):
        out = torch.empty(m, batch, n, dtype=out_dtype or x.dtype, device=x.device).transpose(0, 1)
    else:
        out = torch.empty(batch, m, n, dtype=out_dtype or x.dtype, device=x.device)
    bm, bn, bk, warps, stages, split = tile(n, k, batch, x.dtype, x.device, m)
    grid = (triton.cdiv(n, bn) * triton.cdiv(m, bm), 1, batch * split)  # row blocks inner (M_INNER)
    part = lock = out
    if split > 1:
        lock = _locks(x.device, grid[0] * grid[1] * batch)
        if lock is None:  # NOTE: a capture without the warm-up's counters: fail loudly, never a library GEMM
            raise RuntimeError("split-K counters must be allocated before a CUDA-graph capture")
        part = torch.empty((1 + (w2 is not None)) * grid[0] * grid[1] * batch * split * bm * bn,
                           dtype=torch.float32, device=x.device)
    res = residual if residual is not None else out
    _mm_nt_kernel[grid](x3, w3, w2_3, out, part, lock, out, 0.0, out, out, 0, 0, batch, res, res.stride(-2),
                        m, n, k, batch, sxb, x3.stride(1), x3.stride(2), swb, w3.stride(1), w3.stride(2),
                        out.stride(0), out.stride(1), out.stride(2),
                        PREC="fma" if x.dtype == torch.float32 else "tf32", GLU=w2 is not None, BLOCK_M=bm, BLOCK_N=bn,
                        BLOCK_K=bk, SPLIT=split, NORM=False, ROUTE=0, ADD=residual is not None, M_INNER=True,
                        num_warps=warps, num_stages=stages, **pdl.launch(x.device, w, w2))
    return out if x.dim() == 3 or w.dim() == 3 else out[0]


def router_logits_exact(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor | None:
    """ops.router_logits' kernel: x [T, H] @ w [E, H]^T -> float32 [T, E]. A half-precision gate against x of
    its dtype takes the half-precision MMA with float32 sums and output (a product of two bf16 values is exact in
    float32; far faster than the FFMA form on the float32 copy: BENCHMARKS.md, "Exact in bf16"); any other pair
    the FFMA form."""
    if x.dtype == w.dtype and x.dtype in (torch.bfloat16, torch.float16):
        return matmul_nt_exact(x, w, out_dtype=torch.float32)
    return matmul_nt_exact(x.float(), float32_weight(w))


def linear_add_exact(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor) -> torch.Tensor | None:
    """ops.linear_add's kernel: residual + x @ w^T with one rounding."""
    return matmul_nt_exact(x, w, residual)


def matmul_nt_glu_exact(x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor) -> torch.Tensor | None:
    """silu(x @ wg^T) * (x @ wu^T) in one launch: both products in the same tile's K order (split-K partials
    summed in split order), the epilogue in float32, one rounding. Weights laid out apart take two products and
    elementwise ops (a choice by the weights alone: every row count takes the same form)."""
    if wu.shape == wg.shape and wu.stride() == wg.stride():
        return matmul_nt_exact(x, wg, w2=wu)
    g = matmul_nt_exact(x, wg)
    u = matmul_nt_exact(x, wu) if g is not None else None
    return None if u is None else torch.nn.functional.silu(g) * u
