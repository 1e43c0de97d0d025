"""MLA tree-verify attention in the absorbed form (Triton): split-KV over the committed prefix, extra
splits for the tree's own keys (about TREE_KEYS each) under the ancestor mask, merged by log-sum-exp.

All T*h query rows share the keys, so the prefix is streamed once per block of BLOCK_M rows (for 64 heads
and T = 1 that is once). prefix_len is read from device memory, so a CUDA graph can replay it at any
length up to the split plan it was captured with. Unused cache slots are never loaded (masked loads), so
NaN-poisoned slots cannot leak in."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# NOTE: measured at K2.6 shapes (benchmarks/kernels.py --only mla_tiles, BENCHMARKS.md): wide key tiles for
# few rows (16 x 64, 16 x 128: one to a few row blocks per split) won at 1-16 tokens and 8 heads, 64 x 64
# (wgmma; ~1 KB spills) at 16 tokens x 64 heads; 16 x 16 is what the float32 demo picks; the smaller tiles
# stay for GPUs with less shared memory (sm_120), where the autotuner skips what does not fit.
_CONFIGS = [
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 64}, num_warps=4, num_stages=2),
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 128}, num_warps=8, num_stages=2),
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 64}, num_warps=8, num_stages=2),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=8, num_stages=2),
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=8, num_stages=2),
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 32}, num_warps=8, num_stages=2),
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=4, num_stages=3),
]


def graph_ms(kernel_call, quantiles=None, cold: bool = False, calls: int = 8, reps: int = 5):
    """Per-call time from CUDA-graph replays of `calls` calls, the median of reps: the autotuner's timing.
    Why: do_bench's per-call events carry launch noise that for kernels of tens of microseconds swapped the
    pick between runs. cold: an L2 flush before each call, the flushes' own replays
    subtracted (benchmarks: bytes from DRAM, as a 61-layer forward reads each cache). The autotuner times
    warm: the flush's time swamps small kernels (the demo's float32 MLA picked a 20% slower tile), and at
    long contexts warm and cold agree within 4%."""
    kernel_call()  # compiles (errors such as OutOfResources reach the autotuner here, outside a capture)
    flush = None
    if cold:
        l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
        flush = torch.empty(2 * max(l2, 1 << 20), dtype=torch.int8, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graphs = []
    with torch.cuda.stream(stream):
        kernel_call()  # NOTE: once on the capture stream first (what torch asks before a capture, e.g. cuBLAS)
        for with_call in (True, False) if cold else (True,):
            graphs.append(torch.cuda.CUDAGraph())
            with torch.cuda.graph(graphs[-1], stream=stream):
                for _ in range(calls):
                    if cold:
                        flush.zero_()
                    if with_call:
                        kernel_call()
    torch.cuda.current_stream().wait_stream(stream)

    def replay_ms(g):
        g.replay()  # warm
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(reps):
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        return sorted(times)[reps // 2]

    total = replay_ms(graphs[0]) - (replay_ms(graphs[1]) if cold else 0.0)
    ms = max(total, 1e-4) / calls
    return ms if quantiles is None else [ms] * len(quantiles)



@triton.jit
def load_q(QL, QP, offs_m, m_ok, NH, sql_t, sql_h, sqp_t, sqp_h, RC: tl.constexpr, P: tl.constexpr):
    """Rows offs_m = token * NH + head of q_lat (four RC-wide column chunks) and q_pe, through their strides."""
    offs_c = tl.arange(0, RC)
    t_row = offs_m // NH
    h_row = offs_m % NH
    qbase = QL + t_row[:, None] * sql_t + h_row[:, None] * sql_h + offs_c[None, :]
    q0 = tl.load(qbase, mask=m_ok[:, None], other=0.0)
    q1 = tl.load(qbase + RC, mask=m_ok[:, None], other=0.0)
    q2 = tl.load(qbase + 2 * RC, mask=m_ok[:, None], other=0.0)
    q3 = tl.load(qbase + 3 * RC, mask=m_ok[:, None], other=0.0)
    qp = tl.load(QP + t_row[:, None] * sqp_t + h_row[:, None] * sqp_h + tl.arange(0, P)[None, :], mask=m_ok[:, None],
                 other=0.0)
    return q0, q1, q2, q3, qp


@triton.jit
def attend_tile(q0, q1, q2, q3, qp, CKV, KPE, slot, n_ok, vis, m_i, l_i, acc0, acc1, acc2, acc3, scale_log2, s_ckv,
                s_kpe, RC: tl.constexpr, P: tl.constexpr, PREC: tl.constexpr):
    """One key tile (cache slots `slot`, loaded where n_ok) of an online softmax: scores over the 512-wide
    latent in four RC-wide chunks plus the rope part, keys outside `vis` masked, the running max, sum and
    accumulators updated. Both MLA kernels' tile body (the same arithmetic in each)."""
    offs_c = tl.arange(0, RC)
    kvb = CKV + slot[:, None].to(tl.int64) * s_ckv + offs_c[None, :]
    kv0 = tl.load(kvb, mask=n_ok[:, None], other=0.0)
    kv1 = tl.load(kvb + RC, mask=n_ok[:, None], other=0.0)
    kv2 = tl.load(kvb + 2 * RC, mask=n_ok[:, None], other=0.0)
    kv3 = tl.load(kvb + 3 * RC, mask=n_ok[:, None], other=0.0)
    kp = tl.load(KPE + slot[:, None].to(tl.int64) * s_kpe + tl.arange(0, P)[None, :], mask=n_ok[:, None], other=0.0)
    s = tl.dot(qp, tl.trans(kp), input_precision=PREC)
    s = tl.dot(q0, tl.trans(kv0), s, input_precision=PREC)
    s = tl.dot(q1, tl.trans(kv1), s, input_precision=PREC)
    s = tl.dot(q2, tl.trans(kv2), s, input_precision=PREC)
    s = tl.dot(q3, tl.trans(kv3), s, input_precision=PREC)
    s = s * scale_log2
    s = tl.where(vis, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    pb = p.to(kv0.dtype)
    acc0 = tl.dot(pb, kv0, acc0 * alpha[:, None], input_precision=PREC)
    acc1 = tl.dot(pb, kv1, acc1 * alpha[:, None], input_precision=PREC)
    acc2 = tl.dot(pb, kv2, acc2 * alpha[:, None], input_precision=PREC)
    acc3 = tl.dot(pb, kv3, acc3 * alpha[:, None], input_precision=PREC)
    return m_new, l_i, acc0, acc1, acc2, acc3


@triton.autotune(configs=_CONFIGS, key=["M", "n_splits", "SCAP"], do_bench=graph_ms, cache_results=True)
@triton.jit(do_not_specialize=["M", "T", "NH", "n_splits", "n_tree", "SCAP"])
def _mla_split_kernel(QL, QP, CKV, KPE, PLEN, MASK, OP, LP, M, T, NH, n_splits, n_tree, SCAP, scale_log2, s_ckv, s_kpe,
                      sql_t, sql_h, sqp_t, sqp_h, R: tl.constexpr, P: tl.constexpr, RC: tl.constexpr, PREC: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    sid = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    # NOTE: the 512-wide latent is handled as four 128-wide chunks so no dot operand or accumulator
    # needs the whole [*, 512] tile in registers at once (the unchunked form spilled heavily).
    offs_c = tl.arange(0, RC)
    q0, q1, q2, q3, qp = load_q(QL, QP, offs_m, m_ok, NH, sql_t, sql_h, sqp_t, sqp_h, RC, P)
    t_row = offs_m // NH
    L = tl.load(PLEN).to(tl.int32)  # NOTE: int32 or the engine's int64 device length
    is_tree = sid >= n_splits  # NOTE: the tree's keys are split too (a 33-65 node tree was the long pole)
    chunk = tl.cdiv(tl.cdiv(L, n_splits), BLOCK_N) * BLOCK_N
    tchunk = tl.cdiv(tl.cdiv(T, n_tree), BLOCK_N) * BLOCK_N
    tid = sid - n_splits
    start = tl.where(is_tree, L + tid * tchunk, sid * chunk)
    end = tl.where(is_tree, tl.minimum(L + tid * tchunk + tchunk, L + T), tl.minimum(sid * chunk + chunk, L))
    m_i = tl.full([BLOCK_M], -1e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc0 = tl.zeros([BLOCK_M, RC], tl.float32)
    acc1 = tl.zeros([BLOCK_M, RC], tl.float32)
    acc2 = tl.zeros([BLOCK_M, RC], tl.float32)
    acc3 = tl.zeros([BLOCK_M, RC], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < end
        # NOTE: keys >= L exist in tree splits only; a per-element test (not the scalar is_tree) keeps
        # the mask a block, which Triton's interpreter requires
        tm = tl.load(MASK + t_row[:, None] * T + (offs_n - L)[None, :],
                     mask=m_ok[:, None] & (n_ok & (offs_n >= L))[None, :], other=1)
        vis = n_ok[None, :] & (tm != 0)
        m_i, l_i, acc0, acc1, acc2, acc3 = attend_tile(q0, q1, q2, q3, qp, CKV, KPE, offs_n, n_ok, vis, m_i, l_i, acc0,
                                                       acc1, acc2, acc3, scale_log2, s_ckv, s_kpe, RC, P, PREC)
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    inv = (1.0 / l_safe)[:, None]
    lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
    row = sid * M + offs_m
    obase = OP + row[:, None].to(tl.int64) * R + offs_c[None, :]
    # NOTE: a row that saw no key (every row of an empty split: a short prefix under a plan made for the
    # longest) stores its -inf lse only; the merge reads no partial whose lse is -inf
    o_ok = (m_ok & (l_i > 0))[:, None]
    tl.store(obase, acc0 * inv, mask=o_ok)
    tl.store(obase + RC, acc1 * inv, mask=o_ok)
    tl.store(obase + 2 * RC, acc2 * inv, mask=o_ok)
    tl.store(obase + 3 * RC, acc3 * inv, mask=o_ok)
    tl.store(LP + row, lse, mask=m_ok)


@triton.jit(do_not_specialize=["M", "NS"])
def lse_merge_kernel(OP, LP, O, M, NS, R: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_R: tl.constexpr):
    """Split-KV partials OP [NS, M, R] (each normalised) with their log2-sum-exps LP [NS, M] -> O [M, R],
    BLOCK_S splits at a time (a long context's hundreds of splits in one tile spilled). A partial whose
    lse is -inf is not read (it may never have been written). Also the drafter attention's merge
    (triton_draft_attention)."""
    m = tl.program_id(0)
    rb = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_r = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    mx = tl.full([BLOCK_S], float("-inf"), tl.float32)
    for s0 in range(0, NS, BLOCK_S):
        mx = tl.maximum(mx, tl.load(LP + (s0 + offs_s) * M + m, mask=s0 + offs_s < NS, other=float("-inf")))
    top = tl.max(mx, 0)
    top = tl.where(top == float("-inf"), 0.0, top)
    den = tl.zeros([BLOCK_S], tl.float32)
    acc = tl.zeros([BLOCK_R], tl.float32)
    for s0 in range(0, NS, BLOCK_S):
        s_ok = s0 + offs_s < NS
        lse = tl.load(LP + (s0 + offs_s) * M + m, mask=s_ok, other=float("-inf"))
        w = tl.exp2(lse - top)
        den += w
        o = tl.load(OP + ((s0 + offs_s)[:, None].to(tl.int64) * M + m) * R + offs_r[None, :],
                    mask=(s_ok & (lse > float("-inf")))[:, None], other=0.0)
        acc += tl.sum(o * w[:, None], 0)
    out = acc / tl.maximum(tl.sum(den, 0), 1e-30)
    tl.store(O + m * R + offs_r, out.to(O.dtype.element_ty))


def merge_splits(op: torch.Tensor, lp: torch.Tensor, out: torch.Tensor) -> None:
    """op [NS, M, R] fp32, lp [NS, M] -> out [M, R] (any row-contiguous view of M rows of R)."""
    ns, m, r = op.shape
    block_r = min(r, 128)
    # NOTE: tiles of <= 8192 partial values: one pass for the demo's ~100 splits of 64 (32-split tiles
    # there merged twice as slowly), bounded registers for K2.6's hundreds of 512
    block_s = min(triton.next_power_of_2(ns), max(2, 8192 // block_r))
    lse_merge_kernel[(m, r // block_r)](op, lp, out, m, ns, R=r, BLOCK_S=max(2, block_s), BLOCK_R=block_r)


def tuned_configs() -> dict[str, str]:
    """The configs the autotuner chose in this process, by key (rows, splits, span, then dtypes): what to
    compare when an MLA time moves between runs (it tunes on a key's first call, at that call's length)."""
    return {",".join(map(str, key)): str(cfg) for key, cfg in getattr(_mla_split_kernel, "cache", {}).items()}


TREE_KEYS = 16  # tree keys per split: one key tile per program at the smallest BLOCK_N
MAX_TREE_SPLITS = 16
_SM_COUNT: dict[int, int] = {}


def sm_count(device) -> int:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


MIN_SPLIT_KEYS = 256  # NOTE: each split writes [rows, 512] fp32 partials: 64 heads' equal 114 keys of cache
SPLIT_WAVES: int | None = None  # programs per SM the plan aims at (None: the measured rule below)


def plan_splits(m_rows: int, max_prefix: int, device) -> int:
    """Prefix splits: about one program per SM for up to 128 rows, two beyond (BENCHMARKS.md, eighth
    session: one won by 6-16% at 1 token x 64 heads and 16 tokens x 8 heads from 32k keys, and lost by up
    to 40% at 512+ rows), each split >= MIN_SPLIT_KEYS keys."""
    m_blocks = triton.cdiv(m_rows, 64)
    waves = SPLIT_WAVES or (1 if m_blocks <= 2 else 2)
    return max(1, min(triton.cdiv(waves * sm_count(device), m_blocks), triton.cdiv(max(max_prefix, 1), MIN_SPLIT_KEYS)))


# NOTE: a graph plan is tuned on its first call, the load's warm-up, where the device length is 0 and
# every config times the same; tuning at this length instead made the choice stable between runs.
TUNE_LENGTH = 2048
_TUNED: set = set()


def mla_attention_triton(q_lat, q_pe, ckv, kpe, prefix_len, tree_mask, scale, max_prefix: int | None = None,
                         config: triton.Config | None = None):
    """prefix_len: int, or an int32 device tensor [1] (then max_prefix, a host bound, plans the splits).
    config: a fixed tile (one of _CONFIGS) instead of the autotuner's choice (tests, Triton's interpreter)."""
    r = q_lat.shape[-1]
    # NOTE: the kernel splits the latent into 4 power-of-two chunks of >= 16 and merges in 64/128 columns.
    if q_lat.dim() != 3 or r < 64 or r & (r - 1) or q_pe.shape[-1] not in (16, 32, 64, 128):
        from .mla_attention import mla_attention_ref
        return mla_attention_ref(q_lat, q_pe, ckv, kpe, prefix_len, tree_mask, scale)
    t, nh, r = q_lat.shape
    p = q_pe.shape[-1]
    m = t * nh
    dev = q_lat.device
    if torch.is_tensor(prefix_len):
        plen = prefix_len.reshape(1)
        if plen.device != dev or plen.dtype not in (torch.int32, torch.int64):
            plen = plen.to(device=dev, dtype=torch.int32)
        bound = max_prefix if max_prefix is not None else ckv.shape[0] - t
    else:
        plen = torch.full((1,), int(prefix_len), dtype=torch.int32, device=dev)
        bound = int(prefix_len)
    if ckv.stride(-1) != 1:
        ckv = ckv.contiguous()
    if kpe.stride(-1) != 1:
        kpe = kpe.contiguous()
    # NOTE: q rows are read through their (token, head) strides: the absorbed product leaves q_lat transposed
    ql = q_lat if q_lat.stride(-1) == 1 else q_lat.contiguous()
    qp = q_pe.to(ql.dtype)
    qp = qp if qp.stride(-1) == 1 else qp.contiguous()
    mask = tree_mask.to(device=dev)
    mask = mask.view(torch.uint8) if mask.dtype == torch.bool else mask.to(torch.uint8)  # NOTE: a view, no kernel
    mask = mask.contiguous()
    ns = plan_splits(m, bound, dev)
    nt = min(MAX_TREE_SPLITS, triton.cdiv(max(t, 1), TREE_KEYS))
    op = torch.empty(ns + nt, m, r, dtype=torch.float32, device=dev)
    lp = torch.empty(ns + nt, m, dtype=torch.float32, device=dev)
    out = torch.empty(t, nh, r, dtype=q_lat.dtype, device=dev)
    scap = triton.next_power_of_2(bound + 1)
    prec = "ieee" if ql.dtype == torch.float32 else "tf32"

    def launch(length, kernel=_mla_split_kernel, **tile):
        grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), ns + nt)  # noqa: E731
        kernel[grid](ql, qp, ckv, kpe, length, mask, op, lp, m, t, nh, ns, nt, scap, scale * 1.4426950408889634,
                     ckv.stride(0), kpe.stride(0), ql.stride(0), ql.stride(1), qp.stride(0), qp.stride(1), R=r, P=p,
                     RC=r // 4,
                     # NOTE: fp32 models keep IEEE dots: 3xTF32 measured slower here (the demo's 1-33 rows)
                     PREC=prec, **tile)

    if config is not None:
        launch(plen, _mla_split_kernel.fn, **config.all_kwargs())
    else:
        key = (m, ns, scap, ql.dtype, ckv.dtype, plen.dtype)
        if torch.is_tensor(prefix_len) and key not in _TUNED and not torch.cuda.is_current_stream_capturing():
            _TUNED.add(key)
            launch(torch.full_like(plen, min(bound, TUNE_LENGTH)))  # its outputs are overwritten below
        launch(plen)
    merge_splits(op, lp, out)
    return out
