"""The one-shot collectives of a tensor-parallel group on GPUs: each rank's peer-visible buffer and flag
array (CUDA IPC handles exchanged once, over the host group), and all-reduce / all-gather as one Triton
launch per message (ops/triton_exchange.py). Every rank sums the partials in rank order 0..N-1, so the
sum is the same on every rank and for every message size (a row rounds the same in a 1-row step and in a
256-row prefill chunk), and nothing syncs with the host, so CUDA graphs record it.

Messages larger than one buffer half go in pieces (an element's sum does not depend on its piece)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.multiprocessing.reductions import reduce_tensor

from ..ops.triton_exchange import REGION_BYTES, exchange


class OneShot:
    def __init__(self, rank: int, world: int, device: torch.device, host_group, half_bytes: int):
        """Collective: every rank constructs it at the same point (the handles travel over host_group, gloo).
        half_bytes: the largest piece of one message (each buffer holds two)."""
        self.rank, self.world, self.device, self.host = rank, world, device, host_group
        self.half = -(-half_bytes // REGION_BYTES) * REGION_BYTES
        programs = self.half // REGION_BYTES
        self.data = torch.zeros(2 * self.half, dtype=torch.uint8, device=device)
        self.flags = torch.zeros(programs * world, dtype=torch.int32, device=device)  # [program, rank]
        self.epochs = torch.zeros(programs, dtype=torch.int32, device=device)  # collectives each program ran
        torch.cuda.synchronize(device)  # NOTE: zeroed before any peer can see them
        mine = (reduce_tensor(self.data), reduce_tensor(self.flags))
        shared: list = [None] * world
        dist.all_gather_object(shared, mine, group=host_group)
        # NOTE: the peers' mappings stay referenced: their addresses are baked into the pointer tables
        self._peers = [(self.data, self.flags) if q == rank else tuple(fn(*args) for fn, args in shared[q])
                       for q in range(world)]
        self.data_ptrs = torch.tensor([d.data_ptr() for d, _ in self._peers], dtype=torch.int64, device=device)
        self.flag_ptrs = torch.tensor([f.data_ptr() for _, f in self._peers], dtype=torch.int64, device=device)

    def close(self) -> None:
        """Collective: unmap the peers' buffers, then wait until every rank has (a rank that exits while a
        peer still maps its memory makes CUDA complain at exit)."""
        self._peers = []
        self.data_ptrs = self.flag_ptrs = None
        torch.cuda.synchronize(self.device)
        torch.cuda.ipc_collect()
        dist.barrier(group=self.host)

    def _pieces(self, n: int, itemsize: int):
        step = self.half // itemsize
        return [(a, min(n, a + step)) for a in range(0, n, step)]

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's x summed in rank order (float32 accumulation, one rounding); a new tensor."""
        flat = x.contiguous().view(-1)
        out = torch.empty_like(flat)
        for a, b in self._pieces(flat.numel(), flat.element_size()):
            exchange(flat[a:b], out[a:b], self.data_ptrs, self.flag_ptrs, self.epochs, self.half, self.rank,
                     self.world, gather=False)
        return out.view(x.shape)

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's x [..., d] side by side along the last axis: [..., world * d]."""
        flat = x.contiguous().view(-1)
        n = flat.numel()
        out = torch.empty((self.world, n), dtype=x.dtype, device=x.device)
        for a, b in self._pieces(n, flat.element_size()):
            exchange(flat[a:b], out[:, a:b], self.data_ptrs, self.flag_ptrs, self.epochs, self.half, self.rank,
                     self.world, gather=True, out_stride=n)
        return out.view(self.world, *x.shape).movedim(0, -2).reshape(*x.shape[:-1], self.world * x.shape[-1])


def peer_access(world: int) -> bool:
    """Whether every pair of the first `world` GPUs can map each other's memory (one-shot across GPUs)."""
    return all(torch.cuda.can_device_access_peer(a, b) for a in range(world) for b in range(world) if a != b)
