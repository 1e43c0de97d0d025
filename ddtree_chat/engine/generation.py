"""What a caller asks of one generation, and the statistics it gets back."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

MODES = ("ddtree", "dflash", "ar")
MAX_BUDGET = 1023  # tree nodes past the root a round may draft (the rope table reserves these positions)
AUTO_BUDGETS = (2, 4, 8, 16, 32, 64, 128, 256)  # the tree sizes --budget auto chooses among


@dataclass(frozen=True)
class GenerationConfig:
    mode: str = "ddtree"  # ddtree | dflash | ar
    budget: int | str = "auto"  # drafted tree nodes per round (root excluded), or "auto"; ddtree only
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    max_new_tokens: int = 512
    stop_token_ids: tuple[int, ...] | None = None  # None: the tokenizer's stop ids

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.budget != "auto" and (not isinstance(self.budget, int) or not 0 <= self.budget <= MAX_BUDGET):
            raise ValueError(f"budget must be a number from 0 to {MAX_BUDGET} or 'auto', not {self.budget!r}")
        if not self.temperature >= 0:  # NOTE: written so that NaN fails too
            raise ValueError(f"temperature must be >= 0, not {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], not {self.top_p!r}")
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")


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
