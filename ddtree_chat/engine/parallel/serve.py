"""A worker rank's command loop: run what rank 0 broadcasts until told to exit.

Every rank runs the same round on the same inputs: rank 0 broadcasts each command (generate / logits /
exit), the workers execute it, and per-round decisions (continue or stop) are broadcast too."""

from __future__ import annotations

from typing import Callable, Mapping, Protocol

from ..errors import EngineError
from .group import TPGroup

Commands = Mapping[str, Callable[..., object]]


class Rank(Protocol):
    """What a loaded rank offers the worker process (the engine, without importing it)."""

    fingerprint: str

    def rank_commands(self) -> Commands: ...


def serve(tp: TPGroup, commands: Commands) -> None:
    """Worker ranks: execute rank 0's commands ((name, *args), broadcast) until told to exit."""
    while True:
        cmd = tp.broadcast(None)
        if cmd[0] == "exit":
            return
        try:
            commands[cmd[0]](*cmd[1:])
        except EngineError:
            pass  # NOTE: deterministic input errors happen on every rank; rank 0 reports them
