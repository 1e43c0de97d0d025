"""Rank 0 of a tensor-parallel group on one GPU, without its peers: every all-reduce a timed stand-in (a GPU
sleep of what the real one would cost), the logits' all-gather a local copy of the gathered size, host
decisions rank 0's own. The per-rank benchmarks (k26_forward.py, k26_round.py) build a rank's shard with it."""

from __future__ import annotations

import torch
from kernels import events_ms

from ddtree_chat.engine.parallel import SINGLE, TPGroup


class StandIn:
    """The collectives of rank 0 under TP without peers: an all-reduce is a GPU sleep of a set time (what
    the real one would cost), the logits' all-gather a local copy of the gathered size."""

    def __init__(self, world: int):
        self.world, self.cycles, self.per_us = world, 0, None

    def set_us(self, microseconds: float) -> None:
        if not torch.cuda.is_available():  # NOTE: a CPU smoke run has nothing to sleep on
            return
        if microseconds > 0 and self.per_us is None:  # NOTE: calibrated once, in this process
            probe = 1_000_000
            self.per_us = probe / (events_ms(lambda: torch.cuda._sleep(probe), 5) * 1e3)
        self.cycles = int(microseconds * self.per_us) if microseconds > 0 else 0

    def all_reduce(self, x):
        if self.cycles:
            torch.cuda._sleep(self.cycles)
        return x

    def all_gather_last(self, x):
        return torch.cat([x] * self.world, dim=-1)


class StandInGroup(TPGroup):
    """Rank 0's TPGroup without peers: GPU collectives through its StandIn (oneshot), host decisions its own."""

    def broadcast(self, obj):
        return obj

    def gather_objects(self, obj) -> list:
        return [obj] * self.world


def stand_in_group(world: int) -> tuple[TPGroup, StandIn]:
    """Rank 0's group of `world` ranks with stand-in collectives (world 1: SINGLE) and its StandIn."""
    stand_in = StandIn(world)
    return (SINGLE if world == 1 else StandInGroup(0, world, oneshot=stand_in)), stand_in
