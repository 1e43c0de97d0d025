"""How a kernel addresses the rows of a strided view without copying it."""

from __future__ import annotations

import torch


def row_layout(x: torch.Tensor) -> tuple[int, int, int, int] | None:
    """(rows, inner, s_outer, s_inner) for x's rows of d = x.shape[-1]: row r starts at
    (r // inner) * s_outer + (r % inner) * s_inner, so a slice of a wider tensor (a fused projection's q, k
    or latent part, [..., heads, d] inside [..., width]) is read in place. None: no such pair of strides."""
    d = x.shape[-1]
    if x.stride(-1) != 1:
        return None
    try:
        v = x.view(-1, d)  # NOTE: exists iff the leading axes share one row stride
        return v.shape[0], 1, v.stride(0), 0
    except RuntimeError:
        pass
    try:
        v = x.view(-1, x.shape[-2], d)
        return v.shape[0] * v.shape[1], v.shape[1], v.stride(0), v.stride(1)
    except RuntimeError:
        return None
