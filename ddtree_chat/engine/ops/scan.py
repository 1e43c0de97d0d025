"""A running sum along each row, whose values do not depend on how many rows share the launch: the top-p
filter's mass of the likelier tokens (engine/sampling.py) must be the same for an AR step's one row and a
tree's many. torch.cumsum on CUDA is not: one row takes CUB's device scan, several rows a block scan whose
thread shape follows the row count; the GPU kernel is ops/triton_scan.py. The CPU's scan runs each row in
order, the same for any row count."""

from __future__ import annotations

import torch

from .registry import define


def row_cumsum_ref(x: torch.Tensor) -> torch.Tensor:
    """x [N, V] float32 -> [N, V]: the inclusive running sum of each row."""
    return x.cumsum(-1)


ROW_CUMSUM = define("row_cumsum", row_cumsum_ref)


def row_cumsum(x: torch.Tensor) -> torch.Tensor:
    return ROW_CUMSUM(x)
