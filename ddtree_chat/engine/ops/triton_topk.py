"""topk(log_softmax(x)) over a vocabulary (ops/topk.py) in two Triton launches.

1. One program per (row, vocabulary chunk): the chunk's max and sum of exp (for the row's log-sum-exp)
   and its top K candidates.
2. One program per row: the top K of its chunks' candidates, minus the log-sum-exp.

A candidate is one int64 key that sorts as (value, then lower token id first): the float's bits made
order-preserving in the high half, 2^31 - 1 - id in the low half, so Triton's bitonic top-k moves value
and id together. Only the drafter uses it: ties may order differently from torch.topk (the target
verifies every token)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_CANDIDATES = 8192  # stage 2 holds chunks x K keys in one program's registers
# NOTE: chunks past 2048 keys (K2.6's vocabulary at k >= 128) sort slower than torch's top-k (kernels.py
# --only small); those shapes stay on the reference
MAX_CHUNK = 2048
_LOW = tl.constexpr(0x7FFFFFFF)
_NONE = tl.constexpr(-9187343239835811840)  # (-inf's ordered bits << 32) | 0: below every real key


@triton.jit
def _flip(b):
    """int32 float bits <-> int32 that orders as the float (an involution)."""
    return b ^ ((b >> 31) & 0x7FFFFFFF)


@triton.jit
def _chunk_kernel(X, CAND, STATS, V, sx, C, CHUNK: tl.constexpr, K: tl.constexpr):
    r = tl.program_id(0)
    c = tl.program_id(1)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    ok = offs < V
    x = tl.load(X + r.to(tl.int64) * sx + offs, mask=ok, other=float("-inf")).to(tl.float32)
    m = tl.max(x, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(tl.exp(x - m_safe), 0)
    low = tl.where(ok, _LOW - offs, 0)  # NOTE: x = -inf there too, so the key is _NONE
    key = (_flip(x.to(tl.int32, bitcast=True)).to(tl.int64) << 32) | low.to(tl.int64)
    top = tl.topk(key, K)
    row = (r * C + c).to(tl.int64)
    tl.store(CAND + row * K + tl.arange(0, K), top)
    tl.store(STATS + row * 2, m)
    tl.store(STATS + row * 2 + 1, s)


@triton.jit
def _merge_kernel(CAND, STATS, VALS, IDS, C, k, K: tl.constexpr, CB: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, CB * K)
    key = tl.load(CAND + r * C * K + offs, mask=offs < C * K, other=_NONE)
    top = tl.topk(key, K)
    oc = tl.arange(0, CB)
    c_ok = oc < C
    m = tl.load(STATS + (r * C + oc) * 2, mask=c_ok, other=float("-inf"))
    s = tl.load(STATS + (r * C + oc) * 2 + 1, mask=c_ok, other=0.0)
    mx = tl.max(m, 0)
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    lse = mx + tl.log(tl.sum(s * tl.exp(m - mx), 0))
    val = _flip((top >> 32).to(tl.int32)).to(tl.float32, bitcast=True)
    ids = _LOW - (top & 0xFFFFFFFF).to(tl.int32)
    j = tl.arange(0, K)
    tl.store(VALS + r * k + j, val - lse, mask=j < k)
    tl.store(IDS + r * k + j, ids.to(tl.int64), mask=j < k)


def plan(v: int, k: int) -> tuple[int, int, int] | None:
    """(CHUNK, K, chunks) for a vocabulary v and k, or None when the candidates do not fit one program."""
    kp = max(2, triton.next_power_of_2(k))
    chunk = max(kp, 1024)
    while triton.next_power_of_2(triton.cdiv(v, chunk)) * kp > MAX_CANDIDATES and chunk < MAX_CHUNK:
        chunk *= 2
    c = triton.cdiv(v, chunk)
    return (chunk, kp, c) if triton.next_power_of_2(c) * kp <= MAX_CANDIDATES and chunk <= MAX_CHUNK else None


def topk_logprobs_triton(x: torch.Tensor, k: int):
    """ops.topk_logprobs on a [R, V] float tensor with unit last stride; None for what it does not serve."""
    if x.dim() != 2 or x.stride(-1) != 1 or not x.dtype.is_floating_point or not 1 <= k <= x.shape[1] < 2**31:
        return None
    r, v = x.shape
    p = plan(v, k)
    if p is None or r == 0:
        return None
    chunk, kp, c = p
    cand = torch.empty(r, c, kp, dtype=torch.int64, device=x.device)
    stats = torch.empty(r, c, 2, dtype=torch.float32, device=x.device)
    vals = torch.empty(r, k, dtype=torch.float32, device=x.device)
    ids = torch.empty(r, k, dtype=torch.int64, device=x.device)
    _chunk_kernel[(r, c)](x, cand, stats, v, x.stride(0), c, CHUNK=chunk, K=kp, num_warps=4 if chunk <= 2048 else 8)
    _merge_kernel[(r,)](cand, stats, vals, ids, c, k, K=kp, CB=triton.next_power_of_2(c),
                        num_warps=4 if c * kp <= 2048 else 8)
    return vals, ids
