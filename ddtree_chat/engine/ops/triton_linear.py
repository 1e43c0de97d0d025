"""Small-M float32 products y = x @ w^T in Triton: one K loop per output tile, tensor-core dots in
3xTF32 (split operands, float32-level error, as cuBLAS's FFMA kernels).

Why: for the 16-257 row products of a tree verify (K, N of a few hundred), cuBLAS picks split-K kernels
(a memset, a 'largek' GEMM and a scaling pass), a launch-latency-bound cost repeated ~100 times per
round, which one launch of this kernel undercuts (BENCHMARKS.md history). Batched (one
batch per grid row) with arbitrary strides, so the MLA absorption and the dense experts use it too.
Where cuBLAS wins (measured: benchmarks/kernels.py --only linear) matmul_nt_fast keeps it.

Few rows (FMA_ROWS, by shape: _precision) take an FFMA form instead: the broadcast product [BM, BK, BN]
summed over K, K spread over lanes, so no warp runs a chain of dependent MMAs over K (the latency of a
few-row product); float32 throughout (~1e-7 relative), also at one row, where it beats cuBLAS's gemv.

GLU=True computes silu(x @ wg^T) * (x @ wu^T) in one launch (a SwiGLU MLP's gate/up half: four kernels
under cuBLAS - two products, the SiLU, the product - for any row count)."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from . import pdl
from .pdl import prefetch_l2, wait_previous

MAX_M = 512  # prefill-sized products stay on cuBLAS (this kernel was measured up to 257 rows)
MIN_M = 16  # below, cuBLAS's small-M kernels are as fast as tf32x3 dots (except against a wide N)
MAX_K = 512  # a long K loop (the drafter's 1536-wide MLP) is slower here than cuBLAS's split-K: split it
SPLIT_K_CHUNK = 256  # K per split beyond MAX_K
MAX_SPLIT_K = 8192  # beyond, cuBLAS (the split count is a compile-time constant: one compile per K)
WIDE_N = 4096  # lm-head-wide products: this kernel wins from 2 rows


def _fma_rows(spec: str) -> range:
    """DDTREE_FMA_ROWS: "lo-hi" (rows that may take the FFMA form, by shape: _precision) or "0" (none), for
    side-by-side benchmarks."""
    if spec.strip() == "0":
        return range(0)
    lo, sep, hi = spec.partition("-")
    if not (sep and lo.strip().isdigit() and hi.strip().isdigit()):
        raise ValueError(f"DDTREE_FMA_ROWS must be 'lo-hi' (e.g. 1-64) or 0, not {spec!r}")
    return range(int(lo), int(hi) + 1)


FMA_ROWS = _fma_rows(os.environ.get("DDTREE_FMA_ROWS", "1-64"))


def _tile(m: int, n: int, precision: str = "tf32x3", k: int = 256) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) by shape, not autotuned: each autotune config was one more
    compile per tile height, GLU flag and argument specialisation (150 binaries of this kernel in one GPU
    run's cache, a large part of a first start's compiles). Measured (kernels.py --only tiles): 16x32
    tiles are fastest for every N < 2048 at 8-65 rows (more programs: a tile's K loop is the latency);
    taller and wider tiles win only for the lm head."""
    # kernels.py --only fma: 4 columns, K in one or two steps. NOTE: never all three sides >= 16: Triton (3.6)
    # then turns the broadcast sum into a tensor-core dot in plain TF32 (7.7e-4 relative error on the H200)
    if precision == "fma":
        bm = min(16, triton.next_power_of_2(m))
        return (bm, 4, 256, 8, 1) if k > 128 else (bm, 4, 128, 4, 2)
    if n >= 2048 and m > 16:
        return min(64, triton.next_power_of_2(m)), 64, 64, 4, 2
    return 16, 32, 64, 4, 3


@triton.jit
def _mac(acc, x, w, PREC: tl.constexpr):
    """acc [BM, BN] + x [BM, BK] @ w [BK, BN]. PREC "fma": float32 FFMAs over the broadcast [BM, BK, BN],
    summed over K (K spread over lanes: no chain of dependent MMAs over K inside one warp, the latency of a
    few-row product); else tl.dot's input_precision."""
    if PREC == "fma":
        acc = acc + tl.sum(x[:, :, None] * w[None, :, :], axis=1)
    else:
        acc = tl.dot(x, w, acc, input_precision=PREC)
    return acc


@triton.jit(do_not_specialize=["M"])
def _mm_nt_kernel(X, W, W2, O, PART, LOCK, NW, eps, IDS, RW, n_top, s_top, n_routed, RES, srm, M, N, K, BATCH, sxb,
                  sxm, sxk, swb, swn, swk, sob, som, son, PREC: tl.constexpr, GLU: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr, NORM: tl.constexpr,
                  ROUTE: tl.constexpr, ADD: tl.constexpr, M_INNER: tl.constexpr = False, PDL: tl.constexpr = False,
                  PREFETCH: tl.constexpr = False):
    """SPLIT > 1: program_id(2) = batch * SPLIT + split over K; each split stores its [BLOCK_M, BLOCK_N]
    partial in PART (GLU: the up product's after all tiles' gate partials), and the tile's last split to
    finish (a counter in LOCK, reset after) adds them in split order (deterministic), applies GLU's
    epilogue and stores the tile: split-K in one launch.
    NORM (SPLIT == 1): x's rows are RMS-normed first (weight NW [K], eps), as ops.rms_norm_ref does: a
    first pass over K for the rows' mean square, then each k-step scales x by rstd, then by NW.
    ROUTE (SPLIT == 1; ROUTE = n_top padded to a power of two): batch b is expert b; row m's output is
    scaled by its routing weight for b, the sum of RW[m, j] over the j with IDS[m, j] == b (0 if none);
    experts b >= n_routed are shared ones (weight 1).
    ADD (2-D, not with GLU): the finished tile plus RES [M, N] (row stride srm): a residual added in the store.
    M_INNER: program_id(0) enumerates row blocks first (grid (M blocks * N blocks, 1, ...)): the programs
    that read one weight tile run together, so tall products read each tile from DRAM once.
    PDL (a programmatic dependent launch, ops/pdl.py): wait for the kernel before; PREFETCH (unit K stride): first
    prefetch this program's weight rows (and W2's), which no earlier kernel writes, into L2."""
    if M_INNER:
        m_tiles = tl.cdiv(M, BLOCK_M)
        pid_n = tl.program_id(0) // m_tiles
        pid_m = tl.program_id(0) % m_tiles
    else:
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
    b = (tl.program_id(2) // SPLIT).to(tl.int64)
    sid = tl.program_id(2) % SPLIT
    k_chunk = tl.cdiv(tl.cdiv(K, SPLIT), BLOCK_K) * BLOCK_K
    k_lo = sid * k_chunk
    k_hi = tl.minimum(K, k_lo + k_chunk)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok, n_ok = offs_m < M, offs_n < N
    if PREFETCH:
        if k_hi > k_lo:
            rows = b * swb + tl.minimum(offs_n, N - 1).to(tl.int64) * swn + k_lo  # [BN] row starts (swk == 1)
            nbytes = tl.zeros([BLOCK_N], tl.int32) + (k_hi - k_lo) * (W.dtype.element_ty.primitive_bitwidth // 8)
            prefetch_l2(W + rows, nbytes)
            if GLU:
                prefetch_l2(W2 + rows, nbytes)
    wait_previous(PDL)
    xp = X + b * sxb + offs_m[:, None] * sxm + (k_lo + offs_k)[None, :] * sxk  # [BM, BK]
    if NORM:
        ss = tl.zeros([BLOCK_M], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            x = tl.load(xp + k0 * sxk, mask=m_ok[:, None] & (offs_k + k0 < K)[None, :], other=0.0)
            ss += tl.sum(x * x, axis=1)
        rstd = 1.0 / tl.sqrt(ss / K + eps)
    w_off = b * swb + offs_n[None, :] * swn + (k_lo + offs_k)[:, None] * swk  # [BK, BN]; W2 shares W's strides
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k_ok = offs_k + k0 < k_hi
        x = tl.load(xp, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if NORM:
            x = x * rstd[:, None] * tl.load(NW + k0 + offs_k, mask=k_ok, other=0.0)[None, :]
        w_ok = k_ok[:, None] & n_ok[None, :]
        acc = _mac(acc, x, tl.load(W + w_off, mask=w_ok, other=0.0), PREC)
        if GLU:
            acc2 = _mac(acc2, x, tl.load(W2 + w_off, mask=w_ok, other=0.0), PREC)
        xp += BLOCK_K * sxk
        w_off += BLOCK_K * swk
    if GLU and SPLIT == 1:
        acc = acc / (1.0 + tl.exp(-acc)) * acc2  # silu(gate) * up
    if ROUTE:
        offs_j = tl.arange(0, ROUTE)
        top = m_ok[:, None] & (offs_j < n_top)[None, :]
        at = offs_m[:, None] * s_top + offs_j[None, :]
        chosen = tl.load(IDS + at, mask=top, other=-1) == b
        scale = tl.sum(tl.where(chosen, tl.load(RW + at, mask=top, other=0.0), 0.0), 1)
        acc = acc * tl.where(b >= n_routed, 1.0, scale)[:, None]
    op = O + b * sob + offs_m[:, None] * som + offs_n[None, :] * son
    rp = RES + offs_m[:, None] * srm + offs_n[None, :]
    if SPLIT == 1:
        if ADD:
            acc += tl.load(rp, mask=m_ok[:, None] & n_ok[None, :], other=0.0)
        tl.store(op, acc, mask=m_ok[:, None] & n_ok[None, :])
    else:
        tile = (b * tl.cdiv(M, BLOCK_M) + pid_m) * tl.cdiv(N, BLOCK_N) + pid_n
        offs_t = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        part = PART + tile * (SPLIT * BLOCK_M * BLOCK_N) + offs_t
        # GLU: the up partials after every tile's gate partials ([BATCH, M tiles, N tiles, SPLIT] of each)
        part2 = part + BATCH * tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N) * (SPLIT * BLOCK_M * BLOCK_N)
        tl.store(part + sid * (BLOCK_M * BLOCK_N), acc)
        if GLU:
            tl.store(part2 + sid * (BLOCK_M * BLOCK_N), acc2)
        tl.debug_barrier()  # every thread's partial is stored before the counter moves (acq_rel atomic)
        if tl.atomic_add(LOCK + tile, 1) == SPLIT - 1:
            total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for s in tl.static_range(SPLIT):
                total += tl.load(part + s * (BLOCK_M * BLOCK_N), cache_modifier=".cg")  # NOTE: L2, not a stale L1
            if GLU:
                up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
                for s in tl.static_range(SPLIT):
                    up += tl.load(part2 + s * (BLOCK_M * BLOCK_N), cache_modifier=".cg")
                total = total / (1.0 + tl.exp(-total)) * up
            if ADD:
                total += tl.load(rp, mask=m_ok[:, None] & n_ok[None, :], other=0.0)
            tl.store(op, total, mask=m_ok[:, None] & n_ok[None, :])
            tl.atomic_xchg(LOCK + tile, 0)  # ready for the next launch (graph replays reuse the counters)


def _as3(t: torch.Tensor, batch: int) -> tuple[torch.Tensor, int]:
    """t [R, C] or [B, R, C] -> ([B, R, C] view, its batch stride; 0 for a shared 2-D operand)."""
    if t.dim() == 2:
        return t.unsqueeze(0).expand(batch, *t.shape), 0
    return t, t.stride(0)


def _fits(x: torch.Tensor, w: torch.Tensor, max_k: int = MAX_K) -> bool:
    """Shapes this kernel serves (inside registry.prefer_library() ops/gpu.py keeps every call off it)."""
    k = x.shape[-1]
    return (w.dtype == x.dtype and w.shape[-1] == k and x.shape[-2] <= MAX_M and k <= max_k
            and not (x.dim() == 3 and w.dim() == 3 and x.shape[0] != w.shape[0]))


def _kernel_product(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor | None:
    """This kernel where it measured faster than cuBLAS; a long K (the drafter's 1536-wide MLP down
    projection) split over programs, in one launch (cuBLAS: two). None: cuBLAS's turn."""
    m, k = x.shape[-2:]
    n = w.shape[-2]
    prec = _precision(m, n, k, x.dim() == w.dim() == 2)
    if _fits(x, w) and _serves(m, n, prec):
        return matmul_nt_triton(x, w, prec, residual=residual)
    split_prec = _precision(m, n, SPLIT_K_CHUNK, False)
    if k > MAX_K and (m >= 2 or split_prec == "fma") and _fits(x, w, MAX_SPLIT_K):
        return matmul_nt_triton(x, w, split_prec, split=triton.cdiv(k, SPLIT_K_CHUNK), residual=residual)
    return None


def _serves(m: int, n: int, precision: str) -> bool:
    """Whether this kernel takes the product from cuBLAS (kernels.py --only linear, --only fma): from MIN_M
    rows, an lm-head-wide one from 2, and wherever the FFMA form is the pick."""
    return MIN_M <= m or (m >= 2 and n >= WIDE_N) or precision == "fma"


def _precision(m: int, n: int, k: int, plain: bool = True) -> str:
    """Measured (kernels.py --only fma): the FFMA form wins at <= 8 rows (over cuBLAS at one row and the
    tf32x3 dots at eight), and, for a plain product (2-D, one pass over K), up to 48 rows at K >= 128
    against <= 256 columns (the demo's q_a/kv_a, q_b, o_proj); tensor-core dots elsewhere (K = 32-64, the
    768-wide dense MLP, 65 rows, and the stacked experts and split-K at 9+ rows, whose 4-column tiles made a
    17-node verify slower) and on lm-head-wide products (cuBLAS at one row)."""
    if m not in FMA_ROWS or n >= WIDE_N:
        return "tf32x3"
    return "fma" if m <= 8 or (plain and m <= 48 and k >= 128 and n <= 256) else "tf32x3"


def matmul_nt_fast(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The registered op: _kernel_product, else torch.matmul. None (the op's reference) for operands
    above 3-D."""
    if x.dim() > 3 or w.dim() > 3:
        return None
    out = _kernel_product(x, w)
    return out if out is not None else torch.matmul(x, w.transpose(-1, -2))  # also words shape errors as torch does


def linear_add_layout(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor) -> bool:
    """The layouts linear_add_fast and linear_add_addmm serve (2-D, one dtype, unit-stride residual)."""
    return x.dim() == 2 and w.dim() == 2 and residual.shape == (x.shape[0], w.shape[0]) \
        and residual.dtype == x.dtype and residual.stride(-1) == 1 and w.dtype == x.dtype


def linear_add_addmm(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """residual + x @ w^T as cuBLAS's addmm (beta = 1): one launch instead of a product and an add."""
    return torch.addmm(residual, x, w.t())


def linear_add_fast(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor) -> torch.Tensor | None:
    """The registered linear_add (linear_add_layout's layouts): residual + x @ w^T in one launch, the add
    in this kernel's store (float32) or in cuBLAS's (addmm). None for layouts it does not serve."""
    if not linear_add_layout(x, w, residual):
        return None
    out = _kernel_product(x, w, residual) if x.dtype == torch.float32 else None
    return out if out is not None else linear_add_addmm(x, w, residual)


def matmul_nt_glu_fast(x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor) -> torch.Tensor:
    """The registered GLU op: one launch at any row count this kernel serves, else two products + SiLU.
    None (the op's reference) for operands above 3-D."""
    if x.dim() > 3 or wg.dim() > 3:
        return None
    if _fits(x, wg) and wu.shape == wg.shape and wu.stride() == wg.stride() and wu.dtype == wg.dtype:
        prec = _precision(x.shape[-2], wg.shape[-2], wg.shape[-1], x.dim() == wg.dim() == 2)
        return matmul_nt_triton(x, wg, prec, w2=wu)
    return torch.nn.functional.silu(matmul_nt_fast(x, wg)) * matmul_nt_fast(x, wu)


_LOCKS: dict = {}  # device -> int32 split-K counters, zero between launches


def _locks(device, n: int) -> torch.Tensor | None:
    """Counters for n tiles; None under CUDA-graph capture when none are allocated yet (the warm-up
    before a capture allocates them: a capture must not own a buffer that outlives its graph)."""
    buf = _LOCKS.get(device)
    if buf is None or buf.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        buf = _LOCKS[device] = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
    return buf


def routed_glu_fast(x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor, ids: torch.Tensor,
                    weights: torch.Tensor, shared: int = 0) -> torch.Tensor | None:
    """The registered routed_glu (ops.linear.routed_glu_ref) in one launch; None where the GLU kernel
    would not serve."""
    if x.dim() != 2 or wg.dim() != 3 or not _fits(x, wg) or wu.shape != wg.shape or wu.stride() != wg.stride() \
            or wu.dtype != wg.dtype or ids.shape != weights.shape or ids.shape[0] != x.shape[0]:
        return None
    return matmul_nt_triton(x, wg, _precision(x.shape[0], wg.shape[-2], wg.shape[-1], False), w2=wu,
                            route=(ids.contiguous(), weights.float().contiguous(), wg.shape[0] - shared))


def rms_norm_linear_fast(x: torch.Tensor, norm_w: torch.Tensor, eps: float, w: torch.Tensor) -> torch.Tensor | None:
    """The registered rms_norm_linear: the norm folded into this kernel's product wherever matmul_nt_fast
    would take the kernel (a launch less per norm, e.g. a verify's q_a/kv_a, q_b and lm-head products);
    None elsewhere (the op then runs the norm and the product apart: single rows keep cuBLAS)."""
    x2 = x.reshape(-1, x.shape[-1])
    m = x2.shape[0]
    prec = _precision(m, w.shape[0], w.shape[-1])
    if w.dim() != 2 or not _fits(x2, w) or not _serves(m, w.shape[0], prec):
        return None
    out = matmul_nt_triton(x2, w, prec, norm=(norm_w.float().contiguous(), eps))
    return out.view(*x.shape[:-1], w.shape[0])


def matmul_nt_triton(x: torch.Tensor, w: torch.Tensor, precision: str = "tf32x3",
                     w2: torch.Tensor | None = None, tile: tuple[int, ...] | None = None,
                     split: int = 1, norm: tuple[torch.Tensor, float] | None = None,
                     route: tuple[torch.Tensor, torch.Tensor, int] | None = None,
                     residual: torch.Tensor | None = None) -> torch.Tensor | None:
    """x [M, K] or [B, M, K], w [N, K] or [B, N, K] (any strides, float32, CUDA) -> [M, N] or [B, M, N].
    precision: tl.dot's input_precision ("ieee": FFMA dots, slower) or "fma" (_mac's broadcast sum). w2
    (w's shape and strides): the output is silu(x @ w^T) * (x @ w2^T). tile: (BLOCK_M, BLOCK_N, BLOCK_K,
    warps, stages) instead of the shape rule (kernels.py --only tiles / fma sweep them). split > 1: K split
    over that many programs per tile, reduced in the same launch; None when its counters cannot be allocated
    (capture).
    norm: (weight [K] float32, eps): x's rows RMS-normed inside the product (not with split).
    route: (ids, weights [M, k] contiguous (int64, float32), routed experts): batch b is expert b, each row
    scaled by its routing weight for b (1 from the routed count on: shared experts), and the output is
    laid out [M, B, N] (routed_glu_ref's; not with split); so is the output of a batch-inner 3-D x (a
    head-transposed view). residual [M, N] (2-D x and w, unit column stride, not with w2): added to the
    output in the kernel's store."""
    batch = max(x.shape[0] if x.dim() == 3 else 1, w.shape[0] if w.dim() == 3 else 1)
    m, k = x.shape[-2:]
    n = w.shape[-2]
    x3, sxb = _as3(x, batch)
    w3, swb = _as3(w, batch)
    out = torch.empty(batch, m, n, dtype=torch.float32, device=x.device)
    if route is not None:
        assert split == 1, "routing scales the finished tile: no split-K"
    # NOTE: a head-transposed x ([B, M, K] view of [M, B, K], the MLA absorption's) gets its output in that
    # layout too, so transposing it back is contiguous (o_proj's input: no copy per layer)
    if route is not None or (x.dim() == 3 and batch > 1 and x.stride(0) < x.stride(1)):
        out = torch.empty(m, batch, n, dtype=torch.float32, device=x.device).transpose(0, 1)
    block_m, block_n, block_k, warps, stages = tile or _tile(m, n, precision, -(-k // split))
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m), batch * split)
    w2_3 = _as3(w2, batch)[0] if w2 is not None else w3
    part = lock = out
    norm_w, eps = norm if norm is not None else (out, 0.0)
    assert norm is None or split == 1, "the norm reads all of K: no split-K"
    if split > 1:
        tiles = grid[0] * grid[1] * batch
        lock = _locks(x.device, tiles)
        if lock is None:
            return None
        part = torch.empty((1 + (w2 is not None)) * tiles * split * block_m * block_n, dtype=torch.float32,
                           device=x.device)
    ids, rw, n_routed = route if route is not None else (out, out, batch)
    n_top = ids.shape[1] if route is not None else 0
    assert residual is None or (batch == 1 and w2 is None), "the residual is one 2-D output's"
    res = residual if residual is not None else out
    _mm_nt_kernel[grid](x3, w3, w2_3, out, part, lock, norm_w, eps, ids, rw, n_top, n_top, n_routed, res, res.stride(-2),
                        m, n, k, batch, sxb, x3.stride(1), x3.stride(2), swb, w3.stride(1), w3.stride(2), out.stride(0),
                        out.stride(1), out.stride(2), PREC=precision, GLU=w2 is not None, BLOCK_M=block_m,
                        BLOCK_N=block_n, BLOCK_K=block_k, SPLIT=split, NORM=norm is not None,
                        ROUTE=max(2, triton.next_power_of_2(n_top)) if route is not None else 0,
                        ADD=residual is not None, num_warps=warps, num_stages=stages, **pdl.launch(x.device, w, w2))
    if route is not None:
        return out.transpose(0, 1)
    return out if x.dim() == 3 or w.dim() == 3 else out[0]
