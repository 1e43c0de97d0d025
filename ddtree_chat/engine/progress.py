"""What Engine.load reports while it works: progress(done, total, what) after each step."""

from __future__ import annotations

from enum import Enum
from typing import Callable


class Stage(str, Enum):
    COMPILING = "compiling GPU kernels"  # `what` while a first start compiles the round's kernels side by side
    RECORDING = "recording CUDA graphs"  # `what` while the round's graphs are recorded


# what: a tensor's checkpoint name while loading, then a Stage
Progress = Callable[[int, int, str], None] | None
