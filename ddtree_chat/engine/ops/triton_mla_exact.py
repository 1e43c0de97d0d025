"""Row-invariant MLA attention (Triton, absorbed form): a query's output is computed by the same sequence of
floating-point operations whatever the round it belongs to, so a tree node's attention equals, bit for
bit, the attention an AR step computes at the same position (docs/exactness.md).

How: every query walks its visible keys in *logical position* order (the committed prefix 0..L-1, then its
ancestors at L + depth), cut into chunks at fixed multiples of CHUNK positions and, inside a chunk, into
BLOCK_N-key tiles aligned to positions; each chunk is one online softmax from scratch; the chunk partials
are merged in chunk order with a fixed lane layout. None of it depends on T, on the other rows of the
launch, on the context bound the launch was planned for, or on the SM count. Two kinds of programs, one
instruction stream:
  shared (grid axis 1 < NCS): chunk c entirely inside the committed prefix, for BLOCK_M rows of any nodes;
  tail (axis 1 >= NCS): chunk base + i of one node (its heads), positions >= L read from the node's
    ancestor of that depth (the tree key of rank j in its mask row sits at position L + j).
An AR step is the T = 1 case: its tail chunk holds the prefix's last partial chunk and its own key."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_M = 16  # query rows per program (mma.sync rows); fixed: the MMA shape must not change with T
BLOCK_T = 64  # mask entries scanned per step when a tail program looks up its ancestors
MERGE_S = 16  # chunk partials per merge step: a fixed lane layout, so the merge's sum order is fixed too


def chunk_keys(heads: int) -> int:
    """Keys per chunk, by head count only (never by T or context): more heads = more rows sharing a
    chunk's keys, so longer chunks keep the partials' traffic below the cache's."""
    return 512 if heads <= 16 else 1024


def block_n(dtype: torch.dtype) -> int:
    return 32 if dtype == torch.float32 else 64


@triton.jit(do_not_specialize=["M", "T", "NH", "NCS", "HB"])
def _mla_exact_kernel(QL, QP, CKV, KPE, PLEN, MASK, OP, LP, M, T, NH, NCS, HB, scale_log2, s_ckv, s_kpe,
                      sql_t, sql_h, sqp_t, sqp_h, R: tl.constexpr, P: tl.constexpr, RC: tl.constexpr,
                      PREC: tl.constexpr, CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_T: tl.constexpr):
    pid = tl.program_id(0)
    sid = tl.program_id(1)
    L = tl.load(PLEN).to(tl.int32)  # NOTE: int32 or the engine's int64 device length
    base = L // CHUNK  # full chunks inside the committed prefix
    tail = sid >= NCS
    node = tl.minimum(pid // HB, T - 1)
    i = tl.arange(0, BLOCK_M)
    head = (pid % HB) * BLOCK_M + i
    offs_m = tl.where(tail, node * NH + head, pid * BLOCK_M + i)
    # NOTE: per-element tests (not scalar booleans) keep each mask a block, which Triton's interpreter requires
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
    active = (tail & (pid // HB < T)) | ((sid < NCS) & (sid < base) & (pid * BLOCK_M < M))
    hi = tl.where(active, hi, lo)  # an idle program runs no key tile (it still stores its -inf lse)

    offs_c = tl.arange(0, RC)
    offs_p = tl.arange(0, P)
    t_row = offs_m // NH
    h_row = offs_m % NH
    qbase = QL + t_row[:, None] * sql_t + h_row[:, None] * sql_h + offs_c[None, :]
    q0 = tl.load(qbase, mask=m_ok[:, None], other=0.0)
    q1 = tl.load(qbase + RC, mask=m_ok[:, None], other=0.0)
    q2 = tl.load(qbase + 2 * RC, mask=m_ok[:, None], other=0.0)
    q3 = tl.load(qbase + 3 * RC, mask=m_ok[:, None], other=0.0)
    qp = tl.load(QP + t_row[:, None] * sqp_t + h_row[:, None] * sqp_h + offs_p[None, :], mask=m_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], -1e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc0 = tl.zeros([BLOCK_M, RC], tl.float32)
    acc1 = tl.zeros([BLOCK_M, RC], tl.float32)
    acc2 = tl.zeros([BLOCK_M, RC], tl.float32)
    acc3 = tl.zeros([BLOCK_M, RC], tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        n_ok = pos < hi
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
        kvb = CKV + slot[:, None].to(tl.int64) * s_ckv + offs_c[None, :]
        kv0 = tl.load(kvb, mask=n_ok[:, None], other=0.0)
        kv1 = tl.load(kvb + RC, mask=n_ok[:, None], other=0.0)
        kv2 = tl.load(kvb + 2 * RC, mask=n_ok[:, None], other=0.0)
        kv3 = tl.load(kvb + 3 * RC, mask=n_ok[:, None], other=0.0)
        kp = tl.load(KPE + slot[:, None].to(tl.int64) * s_kpe + offs_p[None, :], mask=n_ok[:, None], other=0.0)
        s = tl.dot(qp, tl.trans(kp), input_precision=PREC)
        s = tl.dot(q0, tl.trans(kv0), s, input_precision=PREC)
        s = tl.dot(q1, tl.trans(kv1), s, input_precision=PREC)
        s = tl.dot(q2, tl.trans(kv2), s, input_precision=PREC)
        s = tl.dot(q3, tl.trans(kv3), s, input_precision=PREC)
        s = s * scale_log2
        s = tl.where(n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        pb = p.to(kv0.dtype)
        acc0 = tl.dot(pb, kv0, acc0 * alpha[:, None], input_precision=PREC)
        acc1 = tl.dot(pb, kv1, acc1 * alpha[:, None], input_precision=PREC)
        acc2 = tl.dot(pb, kv2, acc2 * alpha[:, None], input_precision=PREC)
        acc3 = tl.dot(pb, kv3, acc3 * alpha[:, None], input_precision=PREC)
        m_i = m_new
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    inv = (1.0 / l_safe)[:, None]
    lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
    row = sid * M + offs_m
    obase = OP + row[:, None].to(tl.int64) * R + offs_c[None, :]
    o_ok = (m_ok & (l_i > 0))[:, None]  # NOTE: a chunk no row saw stores only its -inf lse; the merge skips it
    tl.store(obase, acc0 * inv, mask=o_ok)
    tl.store(obase + RC, acc1 * inv, mask=o_ok)
    tl.store(obase + 2 * RC, acc2 * inv, mask=o_ok)
    tl.store(obase + 3 * RC, acc3 * inv, mask=o_ok)
    tl.store(LP + row, lse, mask=m_ok)


@triton.jit(do_not_specialize=["M", "NCS", "NTL"])
def _merge_kernel(OP, LP, O, PLEN, M, NCS, NTL, CHUNK: tl.constexpr, R: tl.constexpr, BLOCK_S: tl.constexpr,
                  BLOCK_R: tl.constexpr):
    """Row m's chunk partials in absolute chunk order c = 0, 1, ...: c < base from the shared slots, the
    rest from the row's tail slots. Chunk c always sits in lane c % BLOCK_S of step c // BLOCK_S, so rows
    whose launches hold different numbers of chunks still add the same values in the same order (the
    extra lanes hold exact zeros)."""
    m = tl.program_id(0)
    rb = tl.program_id(1)
    base = tl.load(PLEN).to(tl.int32) // CHUNK
    n = base + NTL
    offs_s = tl.arange(0, BLOCK_S)
    offs_r = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    top = tl.full([BLOCK_S], float("-inf"), tl.float32)
    for c0 in range(0, n, BLOCK_S):
        c = c0 + offs_s
        slot = tl.where(c < base, c, NCS + c - base)
        top = tl.maximum(top, tl.load(LP + slot * M + m, mask=c < n, other=float("-inf")))
    top = tl.max(top, 0)
    top = tl.where(top == float("-inf"), 0.0, top)
    den = tl.zeros([BLOCK_S], tl.float32)
    acc = tl.zeros([BLOCK_R], tl.float32)
    for c0 in range(0, n, BLOCK_S):
        c = c0 + offs_s
        slot = tl.where(c < base, c, NCS + c - base)
        lse = tl.load(LP + slot * M + m, mask=c < n, other=float("-inf"))
        w = tl.exp2(lse - top)
        den += w
        o = tl.load(OP + (slot[:, None].to(tl.int64) * M + m) * R + offs_r[None, :],
                    mask=((c < n) & (lse > float("-inf")))[:, None], other=0.0)
        acc += tl.sum(o * w[:, None], 0)
    out = acc / tl.maximum(tl.sum(den, 0), 1e-30)
    tl.store(O + m * R + offs_r, out.to(O.dtype.element_ty))


def plan(t: int, nh: int, bound: int, chunk: int) -> tuple[int, int]:
    """(shared chunk slots, tail chunk slots per row) for T queries of nh heads over a prefix of at most
    `bound` keys. The plan sizes the launch only; no arithmetic depends on it."""
    ncs = max(bound, 0) // chunk
    ntl = (chunk - 1 + max(t, 1) - 1) // chunk + 1  # chunks the positions base*CHUNK .. L+T-1 can span
    return ncs, ntl


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
    ncs, ntl = plan(t, nh, bound, chunk)
    hb = triton.cdiv(nh, BLOCK_M)
    op = torch.empty(ncs + ntl, m, r, dtype=torch.float32, device=dev)
    lp = torch.empty(ncs + ntl, m, dtype=torch.float32, device=dev)
    out = torch.empty(t, nh, r, dtype=q_lat.dtype, device=dev)
    grid = (max(triton.cdiv(m, BLOCK_M), t * hb), ncs + ntl)
    _mla_exact_kernel[grid](ql, qp, ckv, kpe, plen, mask, op, lp, m, t, nh, ncs, hb, scale * 1.4426950408889634,
                            ckv.stride(0), kpe.stride(0), ql.stride(0), ql.stride(1), qp.stride(0), qp.stride(1),
                            R=r, P=p, RC=r // 4, PREC="ieee" if ql.dtype == torch.float32 else "tf32", CHUNK=chunk,
                            BLOCK_M=BLOCK_M, BLOCK_N=block_n(ql.dtype), BLOCK_T=BLOCK_T, num_warps=4, num_stages=2)
    block_r = min(r, 128)
    _merge_kernel[(m, r // block_r)](op, lp, out, plen, m, ncs, ntl, CHUNK=chunk, R=r, BLOCK_S=MERGE_S,
                                     BLOCK_R=block_r)
    return out
