"""Row-invariant MLA attention (Triton, absorbed form): a query's output is computed by the same sequence of
floating-point operations whatever the round it belongs to, so a tree node's attention equals, bit for
bit, the attention an AR step computes at the same position (docs/exactness.md).

How: every query walks its visible keys in *logical position* order (the committed prefix 0..L-1, then its
ancestors at L + depth), cut into chunks at fixed multiples of CHUNK positions and, inside a chunk, into
SUB_KEYS-key sub-chunks and BLOCK_N-key tiles (block_n: by dtype, latent width and the device's shared memory
per block), all aligned to positions; each sub-chunk is one online softmax from scratch, a chunk is its
sub-chunks folded in position order (one helper, explicit FMAs), and the chunk partials are merged in chunk
order with a fixed lane layout. Who folds varies, the fold does not: with many
rows a program runs a whole chunk and folds in registers; with few (layout()) each sub-chunk gets a program
and the merge folds the stored sub-chunk states, the same operations in the same order. No arithmetic
depends on T, on the other rows of the launch, on the context bound the launch was planned for, or on the SM
count (only the launch's shape does). Two kinds of programs (chunk slot = grid axis 1 // F), one instruction
stream:
  shared (slot < NCS): chunk c entirely inside the committed prefix, for BLOCK_M rows of any nodes;
  tail (slot >= NCS): chunk base + i of one node (its heads), positions >= L read from the node's
    ancestor of that depth (the tree key of rank j in its mask row sits at position L + j).
An AR step is the T = 1 case: its tail chunk holds the prefix's last partial chunk and its own key."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl
from .pdl import wait_previous
from .triton_mla import attend_tile, load_q, sm_count

BLOCK_M = 16  # query rows per program (mma.sync rows); fixed: the MMA shape must not change with T
# mask entries scanned per step when a tail program looks up its ancestors: integer work, no bits depend on it;
# the [BLOCK_N, BLOCK_T] rank match is live beside the accumulators and fold state, 64 made sm_90 spill
BLOCK_T = 32
# the merge's (chunk partials per step, output columns per program) by head count (merge_layout): a fixed lane
# layout per model, so its sum order is fixed too. Few heads: 128 lanes hold a 64k context's chunks in one step and
# 16 programs a row let an AR step's 8 rows fill the GPU; many heads have rows to spare, and 128 lanes at a short
# context folded mostly zeros (benchmarks/kernels.py --only exact_merge chose both)
MERGE_FEW = (128, 32)
MERGE_MANY = (32, 64)
SUB_KEYS = 128  # keys per sub-chunk (fixed by position): the unit a few-row launch gives one program each
FOLD: bool | None = None  # one program per sub-chunk: None by the rule in layout(), or forced (benchmarks, tests)
# NOTE: warps are fixed per build, never per launch: they lay out a tile's row sums (and the merge's lane sums),
# so they are part of the arithmetic; at 8 a thread holds 32 + 32 registers of the [16, 512] fp32 accumulator and
# fold state (64 + 64 at 4, which spill on sm_90: benchmarks/triton_resources.py)
WARPS = 8
HOPPER_BF16_WARPS = 4  # sm_90 bf16: 224 B of spills at 4 warps, yet faster than 8 on the H200 (BENCHMARKS.md)
MERGE_WARPS = 8  # the merge's [16, 128] fold spilled a few bytes at 4 (sm_90, Triton 3.6's ptxas); [128, 32]: none at 8
# the merge is built per F (states a chunk): with contraction on, each build may fuse its multiplies and adds into
# FMAs differently (LLVM and ptxas), so an AR step (F = 4) and a tree (F = 1) rounded the same row apart
MERGE_FP_FUSION = False


def merge_layout(heads: int) -> tuple[int, int]:
    """(BLOCK_S, BLOCK_R) of the merge, by head count only, as chunk_keys: never by T or context."""
    return MERGE_FEW if heads <= 16 else MERGE_MANY


def chunk_keys(heads: int) -> int:
    """Keys per chunk, by head count only (never by T or context): more heads = more rows sharing a
    chunk's keys, so longer chunks keep the partials' traffic below the cache's."""
    return 512 if heads <= 16 else 1024


# keys per tile, widest first: 32 float32 / 64 half keep sm_90 spill-free; the narrower ones fit sm_120's 99 KB
BLOCK_NS = {torch.float32: (32, 16), torch.bfloat16: (64, 32), torch.float16: (64, 32)}
# Triton's small buffers beside the staged operands: 128-2112 bytes measured (Triton 3.6 and 3.9, sm_90 and
# sm_120, R 64-1024, P 16-128, every tile of BLOCK_NS; benchmarks/triton_resources.py --shapes)
SHARED_SLACK = 4096


def shared_bytes(block_n: int, itemsize: int, width: int) -> int:
    """A bound on the main kernel's shared memory per program: the dots' operands staged in shared memory,
    BLOCK_M query rows and a block_n-key tile, each `width` (R + P) elements, plus SHARED_SLACK."""
    return (BLOCK_M + block_n) * width * itemsize + SHARED_SLACK


def block_n(dtype: torch.dtype, width: int, shared: int | None = None) -> int | None:
    """Keys per tile: the widest of BLOCK_NS[dtype] whose shared memory fits `shared` bytes per program (the
    device's opt-in limit; None: no limit, the interpreter), None when none fits. The tile orders a tile's sums
    (part of the arithmetic), so it depends on the dtype, the latent width and the device only, never on T."""
    for n in BLOCK_NS[dtype]:
        if shared is None or shared_bytes(n, dtype.itemsize, width) <= shared:
            return n
    return None


_DEVICE: dict[int, tuple[int, int]] = {}  # device index -> (shared memory per program, major capability)


def _device_facts(device: torch.device) -> tuple[int, int] | None:
    if device.type != "cuda":
        return None
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _DEVICE:
        from triton.runtime import driver

        _DEVICE[idx] = (driver.active.utils.get_device_properties(idx)["max_shared_mem"],
                        torch.cuda.get_device_capability(idx)[0])
    return _DEVICE[idx]


def shared_per_block(device: torch.device) -> int | None:
    """The most shared memory one program may use on `device` (Triton's own launch check: the opt-in limit,
    227 KB on sm_90, 99 KB on sm_120), once per device; None off CUDA (the interpreter)."""
    facts = _device_facts(device)
    return None if facts is None else facts[0]


def major(device: torch.device) -> int | None:
    """The device's major compute capability, once per device; None off CUDA."""
    facts = _device_facts(device)
    return None if facts is None else facts[1]


def main_warps(dtype: torch.dtype, major: int | None) -> int:
    """The main kernel's warps, by dtype and the GPU's major architecture only (never by T; None: the
    interpreter). Other GPUs keep the spill-free 8 until measured."""
    return HOPPER_BF16_WARPS if dtype == torch.bfloat16 and major == 9 else WARPS


@triton.jit
def fold(l, acc, ls, accs, a, b):
    """The accumulator of two unnormalised softmax states (sums l, ls; a, b: fold_scales') folded, the second
    after the first. An explicit FMA, so the main and the merge kernel cannot contract it differently; an
    empty side (sum 0) gives the other unchanged, so a fold of one sub-chunk is that sub-chunk's bits."""
    return tl.where(l == 0, accs, tl.where(ls == 0, acc, tl.fma(acc, a, accs * b)))


@triton.jit
def fold_scales(m, l, ms, ls):
    """Two states' (running max m, sum l) folded, and both sides' scales a, b for fold's accumulators."""
    mx = tl.maximum(m, ms)
    a = tl.exp2(m - mx)
    b = tl.exp2(ms - mx)
    m_new = tl.where(l == 0, ms, tl.where(ls == 0, m, mx))
    l_new = tl.where(l == 0, ls, tl.where(ls == 0, l, tl.fma(l, a, ls * b)))
    return m_new, l_new, a, b


@triton.jit(do_not_specialize=["M", "T", "NH", "NCS", "HB", "F", "s_lp"])
def _mla_exact_kernel(QL, QP, CKV, KPE, PLEN, MASK, OP, LP, M, T, NH, NCS, HB, F, s_lp, scale_log2, s_ckv, s_kpe,
                      sql_t, sql_h, sqp_t, sqp_h, R: tl.constexpr, P: tl.constexpr, RC: tl.constexpr,
                      PREC: tl.constexpr, CHUNK: tl.constexpr, SUB: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, PDL: tl.constexpr = False):
    """Program (pid, q): chunk slot q // F, its sub-chunks (q % F) * CHUNK / SUB / F onward (all of them when F is
    1, one when F is CHUNK / SUB), each an online softmax from scratch folded into the program's state in
    position order; the state is stored unnormalised (acc, max, sum) for the merge to fold and normalise."""
    wait_previous(PDL)
    pid = tl.program_id(0)
    q = tl.program_id(1)
    sid = q // F  # the chunk slot
    per = (CHUNK // SUB) // F  # sub-chunks per program
    L = tl.load(PLEN).to(tl.int32)  # NOTE: int32 or the engine's int64 device length
    base = L // CHUNK  # full chunks inside the committed prefix
    tail = sid >= NCS
    node = tl.minimum(pid // HB, T - 1)
    i = tl.arange(0, BLOCK_M)
    head = (pid % HB) * BLOCK_M + i
    offs_m = tl.where(tail, node * NH + head, pid * BLOCK_M + i)
    # NOTE: per-element tests (not scalar booleans) keep each mask a block, which Triton's interpreter requires
    active = (tail & (pid // HB < T)) | ((sid < NCS) & (sid < base) & (pid * BLOCK_M < M))
    if not active:  # NOTE: a slot past the prefix, or rows past the launch's: the merge never reads it
        return  # (a launch planned for a whole cache, as the engine's recorded programs are, is mostly these)
    tail_v = (i * 0 + sid) >= NCS
    m_ok = (tail_v & ((i * 0 + pid) // HB < T) & (head < NH)) | (~tail_v & (offs_m < M))
    # the node's depth: its visible tree keys minus one (tail programs; shared ones ignore it)
    offs_t = tl.arange(0, BLOCK_T)
    dep = tl.zeros([BLOCK_T], tl.int32)
    for s0 in range(0, T, BLOCK_T):
        dep += tl.load(MASK + node * T + s0 + offs_t, mask=s0 + offs_t < T, other=0).to(tl.int32)
    dep = tl.sum(dep, 0) - 1
    c = tl.where(tail, base + (sid - NCS), sid)
    lo = c * CHUNK
    hi = tl.minimum(lo + CHUNK, tl.where(tail, L + dep + 1, L))

    offs_c = tl.arange(0, RC)
    q0, q1, q2, q3, qp = load_q(QL, QP, offs_m, m_ok, NH, sql_t, sql_h, sqp_t, sqp_h, RC, P)
    fm = tl.full([BLOCK_M], -1e30, tl.float32)  # the program's folded state, empty
    fl = tl.zeros([BLOCK_M], tl.float32)
    f0 = tl.zeros([BLOCK_M, RC], tl.float32)
    f1 = tl.zeros([BLOCK_M, RC], tl.float32)
    f2 = tl.zeros([BLOCK_M, RC], tl.float32)
    f3 = tl.zeros([BLOCK_M, RC], tl.float32)
    # NOTE: sub-chunks past hi are empty, and folding an empty state changes nothing: skipped
    for sub in range((q % F) * per, tl.minimum((q % F) * per + per, tl.cdiv(hi - lo, SUB))):
        s_lo = lo + sub * SUB
        s_hi = tl.minimum(s_lo + SUB, hi)
        m_i = tl.full([BLOCK_M], -1e30, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc0 = tl.zeros([BLOCK_M, RC], tl.float32)
        acc1 = tl.zeros([BLOCK_M, RC], tl.float32)
        acc2 = tl.zeros([BLOCK_M, RC], tl.float32)
        acc3 = tl.zeros([BLOCK_M, RC], tl.float32)
        for n0 in range(s_lo, s_hi, BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)
            n_ok = pos < s_hi
            slot = pos
            if n0 + BLOCK_N > L:  # tree positions: the slot of the node's ancestor of depth pos - L
                want = pos - L
                anc = tl.zeros([BLOCK_N], tl.int32)
                seen = 0
                for s0 in range(0, T, BLOCK_T):
                    vis = tl.load(MASK + node * T + s0 + offs_t, mask=s0 + offs_t < T, other=0).to(tl.int32)
                    rank = seen + tl.cumsum(vis, 0) - 1
                    hit = (vis[None, :] != 0) & (rank[None, :] == want[:, None])
                    anc += tl.sum(tl.where(hit, (s0 + offs_t)[None, :], 0), 1)
                    seen += tl.sum(vis, 0)
                slot = tl.where(pos >= L, L + anc, pos)
            m_i, l_i, acc0, acc1, acc2, acc3 = attend_tile(q0, q1, q2, q3, qp, CKV, KPE, slot, n_ok, n_ok[None, :],
                                                           m_i, l_i, acc0, acc1, acc2, acc3, scale_log2, s_ckv, s_kpe,
                                                           RC, P, PREC)
        m_new, l_new, a, b = fold_scales(fm, fl, m_i, l_i)
        a2, b2, e2, es2 = a[:, None], b[:, None], fl[:, None], l_i[:, None]
        f0 = fold(e2, f0, es2, acc0, a2, b2)
        f1 = fold(e2, f1, es2, acc1, a2, b2)
        f2 = fold(e2, f2, es2, acc2, a2, b2)
        f3 = fold(e2, f3, es2, acc3, a2, b2)
        fm, fl = m_new, l_new
    row = q * M + offs_m
    obase = OP + row[:, None].to(tl.int64) * R + offs_c[None, :]
    o_ok = (m_ok & (fl > 0))[:, None]  # NOTE: an empty state stores its max and sum only; the merge reads no more
    tl.store(obase, f0, mask=o_ok)
    tl.store(obase + RC, f1, mask=o_ok)
    tl.store(obase + 2 * RC, f2, mask=o_ok)
    tl.store(obase + 3 * RC, f3, mask=o_ok)
    tl.store(LP + row, fm, mask=m_ok)
    tl.store(LP + s_lp + row, fl, mask=m_ok)


@triton.jit
def _chunk_state(OP, LP, M, m, c, n, base, NCS, F: tl.constexpr, s_lp, offs_r, R: tl.constexpr,
                 BLOCK_S: tl.constexpr, BLOCK_R: tl.constexpr, ACC: tl.constexpr):
    """Chunks c (one per lane) of row m: their F stored states folded in sub-chunk order (the kernel's fold),
    -> (max, sum, accumulator [BLOCK_S, BLOCK_R] if ACC). Unrolled, and no load waits on another (an empty
    state's unwritten accumulator is read and replaced by zeros): the states' loads are in flight at once."""
    slot = tl.where(c < base, c, NCS + c - base) * F
    fm = tl.full([BLOCK_S], -1e30, tl.float32)
    fl = tl.zeros([BLOCK_S], tl.float32)
    fa = tl.zeros([BLOCK_S, BLOCK_R], tl.float32)
    for j in tl.static_range(F):
        row = (slot + j) * M + m
        ms = tl.load(LP + row, mask=c < n, other=-1e30)
        ls = tl.load(LP + s_lp + row, mask=c < n, other=0.0)
        m_new, l_new, a, b = fold_scales(fm, fl, ms, ls)
        if ACC:
            accs = tl.load(OP + row[:, None].to(tl.int64) * R + offs_r[None, :], mask=(c < n)[:, None], other=0.0)
            accs = tl.where((ls > 0)[:, None], accs, 0.0)  # NOTE: unwritten memory may hold NaN: selected away
            fa = fold(fl[:, None], fa, ls[:, None], accs, a[:, None], b[:, None])
        fm, fl = m_new, l_new
    return fm, fl, fa


@triton.jit
def _lse(fm, fl):
    """Each lane's log2-sum-exp2 of its folded state (-inf for an empty one)."""
    return tl.where(fl > 0, fm + tl.log2(tl.where(fl > 0, fl, 1.0)), float("-inf"))


@triton.jit
def _top(top):
    """The merge's reference maximum from the lanes' maxima [S] (0 if every state is empty)."""
    top = tl.max(top, 0)
    return tl.where(top == float("-inf"), 0.0, top)


@triton.jit
def _weigh(den, acc, fm, fl, fa, top):
    """One step's chunk states, normalised and weighted by exp2(lse - top), added to (den [S], acc [R])."""
    w = tl.exp2(_lse(fm, fl) - top)
    return den + w, acc + tl.sum(fa * (1.0 / tl.where(fl > 0, fl, 1.0))[:, None] * w[:, None], 0)


@triton.jit(do_not_specialize=["M", "NCS", "NTL", "s_lp"])
def _merge_kernel(OP, LP, O, PLEN, M, NCS, NTL, s_lp, F: tl.constexpr, CHUNK: tl.constexpr, R: tl.constexpr,
                  BLOCK_S: tl.constexpr, BLOCK_R: tl.constexpr, PDL: tl.constexpr = False):
    """Row m's chunks in absolute chunk order c = 0, 1, ...: c < base from the shared slots, the rest from
    the row's tail slots; each chunk's F stored states folded first (_chunk_state), then normalised. Chunk c
    always sits in lane c % BLOCK_S of step c // BLOCK_S, so rows whose launches hold different numbers of
    chunks still add the same values in the same order (the extra lanes hold exact zeros)."""
    wait_previous(PDL)
    m = tl.program_id(0)
    rb = tl.program_id(1)
    base = tl.load(PLEN).to(tl.int32) // CHUNK
    n = base + NTL
    offs_s = tl.arange(0, BLOCK_S)
    offs_r = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    den = tl.zeros([BLOCK_S], tl.float32)
    acc = tl.zeros([BLOCK_R], tl.float32)
    if n <= BLOCK_S:  # NOTE: one step holds every chunk (few rows, a short context): its states are read once
        fm, fl, fa = _chunk_state(OP, LP, M, m, offs_s, n, base, NCS, F, s_lp, offs_r, R, BLOCK_S, BLOCK_R, True)
        top = _top(_lse(fm, fl))
        den, acc = _weigh(den, acc, fm, fl, fa, top)
    else:  # the maximum over every step first, then the weighted sum
        top = tl.full([BLOCK_S], float("-inf"), tl.float32)
        for c0 in range(0, n, BLOCK_S):
            fm, fl, _ = _chunk_state(OP, LP, M, m, c0 + offs_s, n, base, NCS, F, s_lp, offs_r, R, BLOCK_S, BLOCK_R,
                                     False)
            top = tl.maximum(top, _lse(fm, fl))
        top = _top(top)
        for c0 in range(0, n, BLOCK_S):
            fm, fl, fa = _chunk_state(OP, LP, M, m, c0 + offs_s, n, base, NCS, F, s_lp, offs_r, R, BLOCK_S, BLOCK_R,
                                      True)
            den, acc = _weigh(den, acc, fm, fl, fa, top)
    out = acc / tl.maximum(tl.sum(den, 0), 1e-30)
    tl.store(O + m * R + offs_r, out.to(O.dtype.element_ty))


def plan(t: int, bound: int, chunk: int) -> tuple[int, int]:
    """(shared chunk slots, tail chunk slots per row) for T queries over a prefix of at most `bound` keys.
    The plan sizes the launch only; no arithmetic depends on it."""
    ncs = max(bound, 0) // chunk
    ntl = (chunk - 1 + max(t, 1) - 1) // chunk + 1  # chunks the positions base*CHUNK .. L+T-1 can span
    return ncs, ntl


def layout(t: int, nh: int, bound: int, device) -> tuple[int, int, int]:
    """(shared chunk slots, tail chunk slots per row, programs per chunk: 1, or one per sub-chunk when a
    program per chunk would leave SMs idle: few rows, a short context). Sizes the launch only."""
    chunk = chunk_keys(nh)
    ncs, ntl = plan(t, bound, chunk)
    programs = max(triton.cdiv(t * nh, BLOCK_M), t * triton.cdiv(nh, BLOCK_M)) * (ncs + ntl)
    few = FOLD if FOLD is not None else programs < sm_count(device)
    return ncs, ntl, chunk // SUB_KEYS if few else 1


def mla_attention_exact(q_lat, q_pe, ckv, kpe, prefix_len, tree_mask, scale, max_prefix: int | None = None):
    """ops.mla_attention_ref's contract: q_lat [T, h, r], q_pe [T, h, p], ckv [S, r], kpe [S, p] (row
    strides free), prefix_len an int or a device tensor [1] (then max_prefix, or S - T, bounds it),
    tree_mask [T, T] bool -> [T, h, r]. None for shapes it does not serve (the caller's reference)."""
    if q_lat.dim() != 3 or q_lat.shape[-1] < 64 or q_lat.shape[-1] & (q_lat.shape[-1] - 1) \
            or q_pe.shape[-1] not in (16, 32, 64, 128):
        return None
    t, nh, r = q_lat.shape
    p = q_pe.shape[-1]
    m = t * nh
    dev = q_lat.device
    bn = block_n(q_lat.dtype, r + p, shared_per_block(dev))
    if bn is None:  # no key tile fits this device's shared memory per block (sm_120: a 1024-wide latent)
        return None
    if torch.is_tensor(prefix_len):
        plen = prefix_len.reshape(1)
        if plen.device != dev or plen.dtype not in (torch.int32, torch.int64):
            plen = plen.to(device=dev, dtype=torch.int32)
        bound = max_prefix if max_prefix is not None else ckv.shape[0] - t
    else:
        plen = torch.full((1,), int(prefix_len), dtype=torch.int32, device=dev)
        bound = int(prefix_len)
    ckv = ckv if ckv.stride(-1) == 1 else ckv.contiguous()
    kpe = kpe if kpe.stride(-1) == 1 else kpe.contiguous()
    ql = q_lat if q_lat.stride(-1) == 1 else q_lat.contiguous()  # NOTE: rows read through their strides
    qp = q_pe.to(ql.dtype)
    qp = qp if qp.stride(-1) == 1 else qp.contiguous()
    mask = tree_mask.to(device=dev)
    mask = (mask.view(torch.uint8) if mask.dtype == torch.bool else mask.to(torch.uint8)).contiguous()
    chunk = chunk_keys(nh)
    ncs, ntl, f = layout(t, nh, bound, dev)
    hb = triton.cdiv(nh, BLOCK_M)
    slots = (ncs + ntl) * f
    op = torch.empty(slots, m, r, dtype=torch.float32, device=dev)
    lp = torch.empty(2, slots, m, dtype=torch.float32, device=dev)  # each state's running max, then its sum
    out = torch.empty(t, nh, r, dtype=q_lat.dtype, device=dev)
    grid = (max(triton.cdiv(m, BLOCK_M), t * hb), slots)
    _mla_exact_kernel[grid](ql, qp, ckv, kpe, plen, mask, op, lp, m, t, nh, ncs, hb, f, slots * m,
                            scale * 1.4426950408889634, ckv.stride(0), kpe.stride(0), ql.stride(0), ql.stride(1),
                            qp.stride(0), qp.stride(1), R=r, P=p, RC=r // 4,
                            PREC="ieee" if ql.dtype == torch.float32 else "tf32", CHUNK=chunk, SUB=SUB_KEYS,
                            BLOCK_M=BLOCK_M, BLOCK_N=bn, BLOCK_T=BLOCK_T,
                            num_warps=main_warps(ql.dtype, major(dev)), num_stages=2, **pdl.launch(dev))
    block_s, block_r = merge_layout(nh)
    block_r = min(r, block_r)
    _merge_kernel[(m, r // block_r)](op, lp, out, plen, m, ncs, ntl, slots * m, F=f, CHUNK=chunk, R=r,
                                     BLOCK_S=block_s, BLOCK_R=block_r, num_warps=MERGE_WARPS,
                                     enable_fp_fusion=MERGE_FP_FUSION, **pdl.launch(dev))
    return out
