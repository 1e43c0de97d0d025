"""ops.row_cumsum on the GPU: each row's running sum computed by the same programs in the same order whatever
the row count (a grid of rows x chunks; every reduction's shape is fixed by the row length alone).

Two launches: the chunks' totals, then each chunk's scan plus the total of the chunks before it."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 2048  # elements a program scans (163840-token vocabularies: 80 chunks a row)


@triton.jit
def _chunk_totals(X, T, V, CHUNKS: tl.constexpr, BLOCK: tl.constexpr):
    r, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    i = c * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + r * V + i, mask=i < V, other=0.0)
    tl.store(T + r * CHUNKS + c, tl.sum(x, 0))


@triton.jit
def _chunk_scans(X, T, Y, V, CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr, BLOCK: tl.constexpr):
    r, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    j = tl.arange(0, CHUNKS_P2)
    before = tl.sum(tl.load(T + r * CHUNKS + j, mask=j < c, other=0.0), 0)  # NOTE: zeros past c: the sum's tree stays fixed
    i = c * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + r * V + i, mask=i < V, other=0.0)
    tl.store(Y + r * V + i, tl.cumsum(x, 0) + before, mask=i < V)


def row_cumsum_triton(x: torch.Tensor) -> torch.Tensor | None:
    """x [N, V] float32 -> its rows' running sums; None for another shape (the reference serves)."""
    if x.dim() != 2 or x.dtype != torch.float32:
        return None
    x = x.contiguous()
    n, v = x.shape
    y = torch.empty_like(x)
    if n and v:
        chunks = triton.cdiv(v, CHUNK)
        totals = torch.empty(n, chunks, dtype=torch.float32, device=x.device)
        _chunk_totals[(n, chunks)](x, totals, v, CHUNKS=chunks, BLOCK=CHUNK, num_warps=4)
        _chunk_scans[(n, chunks)](x, totals, y, v, CHUNKS=chunks, CHUNKS_P2=triton.next_power_of_2(chunks),
                                  BLOCK=CHUNK, num_warps=4)
    return y
