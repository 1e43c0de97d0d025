"""The drafter's block attention (ops/draft_attention.py) in Triton: split-KV over the cached context plus
one split for the block's own keys, merged by log-sum-exp (the MLA kernel's merge). The reference is
15 torch ops per drafter layer (two einsums each for scores and values, their copies, the concat, mask,
softmax, sum: benchmarks/op_counts.py); this is two launches.

One program holds every query row of one kv head (B block slots x the heads that share it), so each
context key is read once per kv head. Only speed depends on the drafter: its numerics need not match
the reference bit for bit (the target verifies every token)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_mla import merge_splits, sm_count


@triton.jit
def _attend(q, K, V, MASK, keys, key_ok, mcol, b_row, m_ok, skn, svn, sm_b, m_i, l_i, acc,
            offs_d, HAS_MASK: tl.constexpr, PREC: tl.constexpr):
    """One tile of keys (rows `keys` of K/V, mask columns `mcol`) folded into the online softmax."""
    k = tl.load(K + keys[:, None].to(tl.int64) * skn + offs_d[None, :], mask=key_ok[:, None], other=0.0)
    v = tl.load(V + keys[:, None].to(tl.int64) * svn + offs_d[None, :], mask=key_ok[:, None], other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=PREC)  # [BLOCK_M, BLOCK_N], already scaled by log2(e)
    vis = m_ok[:, None] & key_ok[None, :]
    if HAS_MASK:
        vis = vis & (tl.load(MASK + b_row[:, None] * sm_b + mcol[None, :], mask=vis, other=0) != 0)
    s = tl.where(vis, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PREC)
    return m_new, l_i, acc


@triton.jit(do_not_specialize=["N", "B", "n_splits"])
def _draft_attn_kernel(Q, KC, VC, KB, VB, MASK, HELD, OP, LP, N, B, n_splits, scale_log2,
                       sq_b, sq_h, skc_n, skc_g, svc_n, svc_g, skb_n, skb_g, svb_n, svb_g, sm_b,
                       NH: tl.constexpr, REP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, HAS_MASK: tl.constexpr, HAS_HELD: tl.constexpr, PREC: tl.constexpr):
    """HAS_HELD: HELD [1] (device) counts the visible context entries, the first ones (no mask tile loads,
    and the splits share only those keys)."""
    g = tl.program_id(0)
    sid = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)  # row m = (block slot m // REP, head g * REP + m % REP)
    m_ok = offs_m < B * REP
    b_row = offs_m // REP
    h_row = g * REP + offs_m % REP
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b_row[:, None] * sq_b + h_row[:, None] * sq_h + offs_d[None, :], mask=m_ok[:, None], other=0.0)
    q = (q.to(tl.float32) * scale_log2).to(q.dtype)
    m_i = tl.full([BLOCK_M], -1e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    is_blk = sid == n_splits
    n_ctx = N
    if HAS_HELD:
        n_ctx = tl.minimum(tl.load(HELD).to(tl.int32), N)
    chunk = tl.cdiv(tl.cdiv(n_ctx, n_splits), BLOCK_N) * BLOCK_N
    c_start = tl.where(is_blk, 0, sid * chunk)
    c_end = tl.where(is_blk, 0, tl.minimum(sid * chunk + chunk, n_ctx))
    for n0 in range(c_start, c_end, BLOCK_N):  # this split's context keys
        keys = n0 + tl.arange(0, BLOCK_N)
        m_i, l_i, acc = _attend(q, KC + g * skc_g, VC + g * svc_g, MASK, keys, keys < c_end, keys, b_row, m_ok,
                                skc_n, svc_n, sm_b, m_i, l_i, acc, offs_d, HAS_MASK, PREC)
    for j0 in range(0, tl.where(is_blk, B, 0), BLOCK_N):  # the block's own keys (the last split only)
        keys = j0 + tl.arange(0, BLOCK_N)
        m_i, l_i, acc = _attend(q, KB + g * skb_g, VB + g * svb_g, MASK, keys, keys < B, N + keys, b_row, m_ok,
                                skb_n, svb_n, sm_b, m_i, l_i, acc, offs_d, HAS_MASK, PREC)
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
    row = b_row * NH + h_row  # NOTE: [B, nh] order, so the merge writes the output in place
    out_row = (sid * B * NH + row).to(tl.int64)
    # NOTE: rows that saw no key (masked entries past the context) store only their -inf lse (the merge skips them)
    tl.store(OP + out_row[:, None] * D + offs_d[None, :], acc / l_safe[:, None], mask=(m_ok & (l_i > 0))[:, None])
    tl.store(LP + out_row, lse, mask=m_ok)


def _rows(t: torch.Tensor) -> bool:
    return t.dim() == 3 and t.stride(-1) == 1


def draft_attention_triton(q, k_ctx, v_ctx, k_blk, v_blk, mask, scale):
    """ops.draft_attention's shapes; None (the caller uses the reference) for shapes it does not serve."""
    b, nh, d = q.shape if q.dim() == 3 else (0, 0, 0)
    if not all(_rows(t) for t in (q, k_ctx, v_ctx, k_blk, v_blk)) or d < 16 or d > 256 or d & (d - 1):
        return None
    n, nkv = k_ctx.shape[0], k_ctx.shape[1]
    if nh % nkv or k_blk.shape != (b, nkv, d) or v_blk.shape != k_blk.shape or v_ctx.shape != k_ctx.shape \
            or len({t.dtype for t in (q, k_ctx, v_ctx, k_blk, v_blk)}) != 1:
        return None
    held = mask if mask is not None and mask.dtype != torch.bool else None
    if held is not None:
        mask = None
        if held.numel() != 1 or held.device != q.device:
            return None
    if mask is not None and (mask.shape != (b, n + b) or mask.dtype != torch.bool):
        return None
    rep = nh // nkv
    block_m = max(16, triton.next_power_of_2(b * rep))
    if block_m > 128:
        return None
    block_n = 64 if d <= 64 else 32
    # NOTE: one key tile per split up to ~2 programs per SM: the drafter's context is a few hundred keys
    # and a split's tiles run serially (several tiles per split measured slower, BENCHMARKS.md history)
    ns = max(1, min(triton.cdiv(2 * sm_count(q.device), nkv), triton.cdiv(max(n, 1), block_n)))
    op = torch.empty(ns + 1, b * nh, d, dtype=torch.float32, device=q.device)
    lp = torch.empty(ns + 1, b * nh, dtype=torch.float32, device=q.device)
    out = torch.empty(b, nh, d, dtype=q.dtype, device=q.device)
    m8 = mask.contiguous().view(torch.uint8) if mask is not None else op  # NOTE: a view (no kernel); unused without a mask
    _draft_attn_kernel[(nkv, ns + 1)](
        q, k_ctx, v_ctx, k_blk, v_blk, m8, held if held is not None else op, op, lp, n, b, ns, scale * 1.4426950408889634,
        q.stride(0), q.stride(1), k_ctx.stride(0), k_ctx.stride(1), v_ctx.stride(0), v_ctx.stride(1),
        k_blk.stride(0), k_blk.stride(1), v_blk.stride(0), v_blk.stride(1), m8.stride(0) if mask is not None else 0,
        NH=nh, REP=rep, D=d, BLOCK_M=block_m, BLOCK_N=block_n, HAS_MASK=mask is not None, HAS_HELD=held is not None,
        # NOTE: 3xTF32 (float32-level error) measured faster than IEEE dots here
        PREC="tf32x3" if q.dtype == torch.float32 else "tf32", num_warps=4)
    merge_splits(op, lp, out)
    return out
