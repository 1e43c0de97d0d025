"""RMSNorm (optionally fused with the residual add)."""

from __future__ import annotations

import torch

from .registry import fast


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # NOTE: statistics in float32 whatever the activation dtype (as HF does).
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    fn = fast("rms_norm", x)
    return fn(x, weight, eps) if fn else rms_norm_ref(x, weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """(rms_norm(x + residual), x + residual): a residual add and the next norm in one pass."""
    fn = fast("add_rms_norm", x)
    if fn:
        return fn(x, residual, weight, eps)
    s = x + residual
    return rms_norm(s, weight, eps), s
