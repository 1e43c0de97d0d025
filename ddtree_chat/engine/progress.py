"""What Engine.load reports while it works: progress(done, total, what) after each step."""

from __future__ import annotations

from enum import Enum
from typing import Callable


class Stage(str, Enum):
    RECORDING = "recording CUDA graphs"  # `what` while the round's graphs are recorded (a first start compiles kernels)


# what: a tensor's checkpoint name while loading, Stage.RECORDING while recording
Progress = Callable[[int, int, str], None] | None
