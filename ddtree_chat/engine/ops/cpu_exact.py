"""Row invariance on the CPU (docs/exactness.md): the reference ops' forms on the CPU that compute a token's
output row with the same floating-point operations whatever other rows share the call, so a tree node's
logits equal the AR step's bit for bit in float32 too, and CI can check it.

What torch's CPU build gives by itself and what these forms add (`benchmarks/cpu_rows.py` measures it):
- products (MKL): a row gets the same bits in every launch whose row count is a multiple of 4 (1-3 rows take
  other kernels, and with several threads so do the rows past a multiple of 4): `padded_rows` pads to one;
- SiLU and sigmoid take a scalar path for a call's last elements short of a 64-element block, with other bits
  (exp, rsqrt and per-row sums do not): `whole_blocks` pads the last dim to a multiple of 64;
- attention: a sum over keys changes with the masked keys around the visible ones and with the key count:
  `mla_attention` walks each query's keys in position order in fixed 256-key chunks (`CHUNK`), an online
  softmax per chunk folded left to right, each chunk's products of one shape (zero keys past its end);
- a batched product gives each batch item the bits of the same product alone (the per-row chunks).
They cost an AR step ~1.4x its time on the CPU (BENCHMARKS.md, "CPU figures"), so DDTREE_CPU_EXACT=1 turns them
on (the tests do); by default the CPU runs the plain torch ops, whose output equals plain decoding in practice
(float32 rounding rarely reaches an argmax), not by construction."""

from __future__ import annotations

from typing import Callable

import torch

from ...knobs import CPU_EXACT, get

ROWS = 4  # products: MKL's row block (its rows keep their bits at every multiple of it)
BLOCK = 64  # elements: SiLU's and sigmoid's vector block on this path
CHUNK = 256  # attention keys per chunk, at fixed multiples of CHUNK positions


def enabled(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and get(CPU_EXACT) == "1"


def padded_rows(fn: Callable, x: torch.Tensor, *args) -> torch.Tensor:
    """fn(x [..., M, K], *args) -> [..., M, N] with x's rows padded with zeros to a multiple of ROWS."""
    m = x.shape[-2]
    if m % ROWS == 0:
        return fn(x, *args)
    pad = x.new_zeros(*x.shape[:-2], -m % ROWS, x.shape[-1])
    return fn(torch.cat([x, pad], -2), *args)[..., :m, :]


def whole_blocks(fn: Callable, x: torch.Tensor) -> torch.Tensor:
    """An elementwise fn on x [..., W], W padded with zeros to a multiple of BLOCK."""
    w = x.shape[-1]
    if w % BLOCK == 0:
        return fn(x)
    return fn(torch.nn.functional.pad(x, (0, -w % BLOCK)))[..., :w]


def grouped_rows(counts: torch.Tensor, group_of: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A grouped product's rows padded per group: counts [G] rows per group, group_of [n] each row's group (rows
    sorted by group) -> (dest [n]: each row's place among the padded rows, ends [G] int32: each group's end)."""
    padded = (counts + ROWS - 1) // ROWS * ROWS
    start, pstart = counts.cumsum(0) - counts, padded.cumsum(0) - padded
    dest = torch.arange(group_of.numel(), device=counts.device) - start[group_of] + pstart[group_of]
    return dest, padded.cumsum(0).to(torch.int32)


def _chunk(ql: torch.Tensor, qp: torch.Tensor, kl: torch.Tensor, kp: torch.Tensor, n: torch.Tensor, scale: float):
    """One chunk's softmax state from scratch: queries ql [B, M, r], qp [B, M, p]; keys kl [B, CHUNK, r] (the
    values too), kp [B, CHUNK, p], or [CHUNK, .] for every query (one [B*M]-row product: the same bits a row);
    n [B, M] each query's visible keys (the chunk's first n) -> (max, sum [B, M, 1], acc [B, M, r]); no visible
    key: (-inf, 0, 0)."""
    s = (torch.matmul(ql, kl.transpose(-1, -2)) + torch.matmul(qp, kp.transpose(-1, -2))) * scale
    s = s.masked_fill(torch.arange(CHUNK) >= n[..., None], float("-inf"))
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - torch.where(m == float("-inf"), 0.0, m))
    return m, p.sum(-1, keepdim=True), torch.matmul(p, kl)


def _fold(a, b):
    """State a, then b after it (an empty b leaves a's values: x * 1 + 0)."""
    if a is None:
        return b
    m = torch.maximum(a[0], b[0])
    shift = torch.where(m == float("-inf"), 0.0, m)  # both empty: exp(-inf) = 0 on both sides, no NaN
    ea, eb = torch.exp(a[0] - shift), torch.exp(b[0] - shift)
    return m, a[1] * ea + b[1] * eb, a[2] * ea + b[2] * eb


def _keys(x: torch.Tensor, lo: int) -> torch.Tensor:
    """The CHUNK key rows from slot lo, zero rows past x's end: [CHUNK, width]."""
    k = x[lo : lo + CHUNK]
    return k if len(k) == CHUNK else torch.cat([k, k.new_zeros(CHUNK - len(k), k.shape[1])])


def mla_attention(q_lat: torch.Tensor, q_pe: torch.Tensor, ckv: torch.Tensor, kpe: torch.Tensor, prefix_len: int,
                  tree_mask: torch.Tensor, scale: float) -> torch.Tensor:
    """ops.mla_attention_ref's math (q_lat [T, h, r], q_pe [T, h, p], ckv [S, r], kpe [S, p], tree_mask [T, T]),
    row-invariant. Chunks wholly below prefix_len are every node's; so are the rest when the nodes are a chain
    (an AR step, a block, a prefill chunk: node i sees slots up to prefix_len + i); a branching tree's nodes gather
    their keys from prefix_len's chunk on (the prefix's tail, then their ancestors at prefix_len + depth) into
    chunks of their own. Every chunk is the same products of [CHUNK] keys whichever way."""
    t, h, _ = q_lat.shape
    L = int(prefix_len)
    pad = q_lat.new_zeros(t, -h % ROWS, 1)  # heads to a multiple of ROWS: the products' rows
    ql, qp = (torch.cat([x, pad.expand(-1, -1, x.shape[-1])], 1).float() for x in (q_lat, q_pe))
    ckv, kpe = ckv[: L + t].float(), kpe[: L + t].float()
    first = L // CHUNK  # the first chunk a node's own keys reach
    depth = tree_mask.sum(-1)  # [T] its ancestors, itself included
    count = L - first * CHUNK + depth  # its keys from `first`'s chunk on
    chain = bool(torch.equal(tree_mask, torch.ones(t, t, dtype=torch.bool).tril()))
    state = None
    for c in range(first if not chain else first + (int(count.max()) + CHUNK - 1) // CHUNK):
        n = (count[:, None] - (c - first) * CHUNK).clamp(0, CHUNK) if c >= first else torch.full((t, 1), CHUNK)
        state = _fold(state, _chunk(ql, qp, _keys(ckv, c * CHUNK), _keys(kpe, c * CHUNK), n, scale))
    if not chain:  # each node's keys from `first`'s chunk on, in position order, gathered
        width = (int(count.max()) + CHUNK - 1) // CHUNK * CHUNK
        slots = torch.full((t, width), L + t, dtype=torch.long)  # slot L + t: a zero key past the end
        slots[:, : L - first * CHUNK] = torch.arange(first * CHUNK, L)
        node, anc = torch.nonzero(tree_mask).unbind(1)  # (node, ancestor) pairs, by node, ancestors in depth order
        rank = torch.arange(len(node)) - (depth.cumsum(0) - depth)[node]  # the ancestor's depth
        slots[node, L - first * CHUNK + rank] = L + anc
        ckv, kpe = (torch.cat([x, x.new_zeros(1, x.shape[1])]) for x in (ckv, kpe))
        for j in range(0, width, CHUNK):
            idx = slots[:, j : j + CHUNK]
            state = _fold(state, _chunk(ql, qp, ckv[idx], kpe[idx], (count[:, None] - j).clamp(0, CHUNK), scale))
    return (state[2] / state[1])[:, :h].to(q_lat.dtype)
