"""The tensor-parallel group of one machine's ranks and the collectives the model uses."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from ... import knobs
from ..errors import EngineError

log = logging.getLogger(__name__)
EXCHANGE_BYTES = 4 << 20  # one piece of a one-shot message: a 256-row prefill chunk of K2.6's 7168-wide bf16 rows


@dataclass(frozen=True)
class TPGroup:
    rank: int = 0
    world: int = 1
    expert_parallel: bool = False  # routed experts split across ranks instead of along the intermediate dim
    host: object = field(default=None, compare=False)  # the gloo group host objects travel in (None: the default group)
    oneshot: object = field(default=None, compare=False)  # parallel.oneshot_collectives.OneShot: the GPU collectives, or None (NCCL)

    def split(self, n: int, what: str) -> tuple[int, int]:
        """This rank's [start, end) of n evenly split items."""
        if n % self.world:
            raise EngineError(f"{what} ({n}) does not divide evenly over {self.world} tensor-parallel ranks; "
                              f"choose a --tp that divides it.")
        per = n // self.world
        return self.rank * per, (self.rank + 1) * per

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's x (a new tensor, or x summed in place)."""
        if self.world == 1:
            return x
        if self.oneshot is not None:
            return self.oneshot.all_reduce(x)
        dist.all_reduce(x)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's x along the last axis (vocab-parallel logits)."""
        if self.world == 1:
            return x
        if self.oneshot is not None:
            return self.oneshot.all_gather_last(x)
        x = x.contiguous()
        if x.is_cuda:  # NOTE: one tensor out, so a CUDA graph can hold the NCCL call
            out = torch.empty((self.world, *x.shape), dtype=x.dtype, device=x.device)
            dist.all_gather_into_tensor(out, x)
            return out.movedim(0, -2).reshape(*x.shape[:-1], -1)
        parts = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(parts, x)
        return torch.cat(parts, dim=-1)

    def broadcast(self, obj):
        """Rank 0's obj on every rank (over the host group: no GPU sync)."""
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.host)
        return box[0]

    def gather_objects(self, obj) -> list:
        """Every rank's obj, in rank order, on every rank."""
        if self.world == 1:
            return [obj]
        out: list = [None] * self.world
        dist.all_gather_object(out, obj, group=self.host)
        return out


    def close(self) -> None:
        """Collective, in an orderly shutdown: release what the ranks share."""
        if self.oneshot is not None:
            self.oneshot.close()


SINGLE = TPGroup()


def rank_device(device: str, rank: int) -> torch.device:
    """The device a rank computes on: its own GPU, GPU 0 for every rank when DDTREE_TP_ONE_GPU=1 (a test
    configuration), or the CPU."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return dev
    return torch.device("cuda", 0 if knobs.tp_one_gpu() else rank)


def backend_for(device: str) -> str:
    """NCCL across GPUs; gloo on the CPU and for ranks sharing one GPU (NCCL refuses a GPU twice)."""
    return "nccl" if torch.device(device).type == "cuda" and not knobs.tp_one_gpu() else "gloo"


def init_group(rank: int, world: int, port: int, device: str, expert_parallel: bool) -> TPGroup:
    backend = backend_for(device)
    dev = rank_device(device, rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)  # NOTE: before the group exists, so NCCL binds this rank's GPU
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=knobs.tp_timeout_s()))
    host = dist.new_group(backend="gloo") if backend == "nccl" else None
    oneshot = _oneshot(rank, world, dev, host) if dev.type == "cuda" else None
    return TPGroup(rank, world, expert_parallel, host, oneshot)


def _oneshot(rank: int, world: int, dev: torch.device, host):
    """The one-shot collectives when every rank can map every other's memory (else NCCL, said once)."""
    from .oneshot_collectives import OneShot, peer_access

    choice = knobs.tp_collectives()
    shared_gpu = knobs.tp_one_gpu()
    if choice == "nccl" and not shared_gpu:
        return None
    ok = shared_gpu or peer_access(world)
    made, err = None, ""
    if ok:
        try:
            made = OneShot(rank, world, dev, host, EXCHANGE_BYTES)
        except RuntimeError as e:  # NOTE: IPC mapping refused (driver, container)
            err = str(e).splitlines()[0][:160]
    everyone = [None] * world
    dist.all_gather_object(everyone, made is not None, group=host)
    if all(everyone):
        return made
    if shared_gpu:
        raise EngineError(f"DDTREE_TP_ONE_GPU needs CUDA IPC between processes, which failed here ({err or 'on a peer'}).")
    if rank == 0:
        log.warning("one-shot all-reduce unavailable (%s); the collectives use NCCL, whose sums are not "
                    "row-invariant", err or "no peer access between these GPUs")
    return None
