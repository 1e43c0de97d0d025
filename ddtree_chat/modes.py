"""Decoding modes and the draft budget's range: the one definition the engine, the CLI and the TUI share
(free of torch, so the CLI and the settings use it before any engine import)."""

from __future__ import annotations

from enum import Enum


class Mode(str, Enum):
    """str-valued, so JSON events, settings files and CLI arguments keep their plain strings."""

    DDTREE = "ddtree"  # verify the `budget` most probable draft prefixes as one tree
    DFLASH = "dflash"  # verify the drafter's argmax chain (one block)
    AR = "ar"  # plain autoregressive decoding, no drafter

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__  # NOTE: f"{mode}" is the value on every Python (3.12 changed the enum default)


MODES = tuple(m.value for m in Mode)
MAX_BUDGET = 1023  # tree nodes past the root a round may draft (the rope table reserves these positions)
# The fixed budgets --budget and /budget accept (besides "auto"). NOTE: not 0: a ddtree round that drafts nothing
# verifies a root token no draft wrote (plain decoding is --mode ar).
BUDGETS = range(1, MAX_BUDGET + 1)
REPEAT_WINDOW = 64  # tokens the repeat penalty looks back over (the sequence's last ones, prompt included)
MAX_REPEAT_PENALTY = 10.0
