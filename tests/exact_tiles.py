"""The product tiles the exact sweep (benchmarks/kernels.py --only exact) may put in
triton_exact_linear.TILES, plus its float32 tile: what the interpreter and compile tests cover."""

import sys
from pathlib import Path


def candidates() -> list[list]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import kernels

    from ddtree_chat.engine.ops import triton_exact_linear as el

    return [list(t) for t in dict.fromkeys([*kernels.EXACT_TILES, el.DEFAULT_TILE, el.FP32_TILE])]
