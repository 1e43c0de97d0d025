"""The one-shot exchange of the tensor-parallel collectives, one Triton launch per message: every rank
writes its partial into its own peer-visible buffer, raises a flag in every rank's flag array, waits for
every rank's flag, then reads all partials and either sums them in rank order 0..N-1 (all-reduce) or
lays them side by side (all-gather). The same sum on every rank, whatever the message size, and no host
sync, so a CUDA graph can hold it. The twin is exchange_ref.

Protocol, per program (a fixed 16 KiB region of the buffer, whatever the dtype):
- its own counter counts the collectives it took part in (e); the buffer has two halves used by e's parity,
  so a rank may write collective e while a slower peer still reads e - 1;
- a peer can be at most one collective ahead of a reader of the same half: it needs this rank's flag e - 1
  to pass e - 1, and this rank raises that only after reading e - 2 (stream order)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

REGION_BYTES = 16384  # bytes of the buffer each program owns: the same region for every dtype


@triton.jit(do_not_specialize=["n", "half", "out_stride"])
def _exchange_kernel(X, OUT, DATA, FLAGS, EPOCHS, n, half, out_stride, RANK: tl.constexpr, WORLD: tl.constexpr,
                     BLOCK: tl.constexpr, GATHER: tl.constexpr):
    pid = tl.program_id(0)
    e = tl.load(EPOCHS + pid) + 1
    tl.store(EPOCHS + pid, e)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    base = (e % 2) * half  # elements: the half this collective uses
    ty = X.dtype.element_ty
    mine = tl.load(DATA + RANK).to(tl.pointer_type(ty))
    tl.store(mine + base + offs, tl.load(X + offs, mask=m), mask=m)
    tl.debug_barrier()  # every thread's partial is written before the flag says so
    for q in tl.static_range(WORLD):
        peer = tl.load(FLAGS + q).to(tl.pointer_type(tl.int32))
        tl.atomic_xchg(peer + pid * WORLD + RANK, e, sem="release", scope="sys")
    own = tl.load(FLAGS + RANK).to(tl.pointer_type(tl.int32))
    for q in tl.static_range(WORLD):
        seen = tl.atomic_add(own + pid * WORLD + q, 0, sem="acquire", scope="sys")
        while seen < e:
            seen = tl.atomic_add(own + pid * WORLD + q, 0, sem="acquire", scope="sys")
    tl.debug_barrier()
    if GATHER:
        for q in tl.static_range(WORLD):
            src = tl.load(DATA + q).to(tl.pointer_type(ty))
            tl.store(OUT + q * out_stride + offs, tl.load(src + base + offs, mask=m, volatile=True), mask=m)
    else:
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for q in tl.static_range(WORLD):  # NOTE: rank order, the same on every rank
            src = tl.load(DATA + q).to(tl.pointer_type(ty))
            acc += tl.load(src + base + offs, mask=m, volatile=True).to(tl.float32)
        tl.store(OUT + offs, acc.to(ty), mask=m)


def exchange(x: torch.Tensor, out: torch.Tensor, data_ptrs: torch.Tensor, flag_ptrs: torch.Tensor,
             epochs: torch.Tensor, half_bytes: int, rank: int, world: int, gather: bool, out_stride: int = 0) -> None:
    """One collective over flat x [n] (n * itemsize <= half_bytes): out [n] (sum) or out rows q * out_stride
    (gather). data_ptrs / flag_ptrs [world] int64: every rank's buffer and flag array in this process."""
    block = REGION_BYTES // x.element_size()
    grid = (triton.cdiv(x.numel(), block),)
    assert grid[0] <= epochs.numel() and x.numel() * x.element_size() <= half_bytes
    _exchange_kernel[grid](x, out, data_ptrs, flag_ptrs, epochs, x.numel(), half_bytes // x.element_size(),
                           out_stride, RANK=rank, WORLD=world, BLOCK=block, GATHER=gather, num_warps=4)


def exchange_ref(parts: list[torch.Tensor], gather: bool) -> torch.Tensor:
    """The twin: every rank's partial [n], summed in rank order in float32 then rounded once, or stacked [world, n]."""
    if gather:
        return torch.stack(parts)
    acc = torch.zeros_like(parts[0], dtype=torch.float32)
    for p in parts:
        acc += p.float()
    return acc.to(parts[0].dtype)
