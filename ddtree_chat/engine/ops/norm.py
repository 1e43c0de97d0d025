"""RMSNorm (optionally fused with the residual add)."""

from __future__ import annotations

import torch

from .registry import define


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # NOTE: statistics in float32 whatever the activation dtype (as HF does).
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


RMS_NORM = define("rms_norm", rms_norm_ref)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return RMS_NORM(x, weight, eps)


def add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    s = x + residual
    return rms_norm_ref(s, weight, eps), s


ADD_RMS_NORM = define("add_rms_norm", add_rms_norm_ref)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """(rms_norm(x + residual), x + residual): a residual add and the next norm in one pass."""
    return ADD_RMS_NORM(x, residual, weight, eps)
