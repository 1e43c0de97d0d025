"""The tensor-parallel group of one machine's ranks and the collectives the model uses."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from ... import knobs
from ..errors import EngineError


@dataclass(frozen=True)
class TPGroup:
    rank: int = 0
    world: int = 1
    expert_parallel: bool = False  # routed experts split across ranks instead of along the intermediate dim

    def split(self, n: int, what: str) -> tuple[int, int]:
        """This rank's [start, end) of n evenly split items."""
        if n % self.world:
            raise EngineError(f"{what} ({n}) does not divide evenly over {self.world} tensor-parallel ranks; "
                              f"choose a --tp that divides it.")
        per = n // self.world
        return self.rank * per, (self.rank + 1) * per

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(x)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's x along the last axis (vocab-parallel logits)."""
        if self.world == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    def broadcast(self, obj):
        """Rank 0's obj on every rank."""
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]


SINGLE = TPGroup()


def init_group(rank: int, world: int, port: int, backend: str, expert_parallel: bool) -> TPGroup:
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=knobs.tp_timeout_s()))
    return TPGroup(rank, world, expert_parallel)
