"""What a caller asks of one generation, and the statistics it gets back."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

from ..modes import BUDGETS, MAX_BUDGET, MAX_REPEAT_PENALTY, MODES, Mode

# the tree sizes --budget auto chooses among; NOTE: none above 64: larger trees paid in no measurement
# (BENCHMARKS.md) and their kernels are over a third of a first start's compile time, the longest ones
AUTO_BUDGETS = (2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class GenerationConfig:
    mode: Mode = Mode.DDTREE  # a plain string ("ddtree", "dflash", "ar") is turned into its Mode
    budget: int | str = "auto"  # drafted tree nodes per round (root excluded), or "auto"; ddtree only
    temperature: float = 0.0
    top_p: float = 1.0
    # > 1 makes each token already among the last modes.REPEAT_WINDOW of the sequence less likely (1: off); every mode
    # applies it to a node from that node's own prefix, so speculative output still equals plain decoding's
    repeat_penalty: float = 1.0
    seed: int = 0
    max_new_tokens: int = 512
    stop_token_ids: tuple[int, ...] | None = None  # None: the tokenizer's stop ids

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        object.__setattr__(self, "mode", Mode(self.mode))
        # NOTE: ar and dflash rounds ignore the budget (their events report 0); a ddtree round needs >= 1 node
        low = BUDGETS.start if self.mode is Mode.DDTREE else 0
        if self.budget != "auto" and (not isinstance(self.budget, int) or not low <= self.budget <= MAX_BUDGET):
            raise ValueError(f"budget must be a number from {low} to {MAX_BUDGET} or 'auto', not {self.budget!r}")
        if not self.temperature >= 0:  # NOTE: written so that NaN fails too
            raise ValueError(f"temperature must be >= 0, not {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], not {self.top_p!r}")
        if not 1 <= self.repeat_penalty <= MAX_REPEAT_PENALTY:
            raise ValueError(f"repeat_penalty must be from 1 to {MAX_REPEAT_PENALTY:g}, not {self.repeat_penalty!r}")
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")


class RoundShape(NamedTuple):
    """A round's mode and its drafted nodes past the root: the budget (ddtree), the block's slots (dflash),
    0 (ar). The one place a round's size is worked out."""

    mode: Mode
    budget: int

    @classmethod
    def of(cls, mode: Mode | str, budget: int, block: int) -> "RoundShape":
        """block: the drafter's block size, 0 without a drafter (every round is then ar)."""
        mode = Mode(mode)
        if mode is Mode.AR or not block:
            return cls(Mode.AR, 0)
        return cls(mode, block - 1 if mode is Mode.DFLASH else budget)

    @property
    def nodes(self) -> int:
        """Tree nodes, root included: the rows the round's verify runs and the cache rows it needs."""
        return self.budget + 1


@dataclass
class Stats:
    rounds: int = 0
    target_forwards: int = 0
    generated: int = 0
    histogram: Counter = field(default_factory=Counter)  # accepted length -> rounds
    time_draft: float = 0.0
    time_target: float = 0.0

    def add_round(self, accepted: int) -> None:
        self.rounds += 1
        self.histogram[accepted] += 1

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per target forward (prefill included)."""
        return self.generated / self.target_forwards if self.target_forwards else 0.0
