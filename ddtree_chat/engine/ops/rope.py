"""Rotary embeddings: YaRN frequencies, interleaved pairs (target MLA) and half-split (DFlash drafter)."""

from __future__ import annotations

import math

import torch

from ..config import RopeScaling
from .norm import rms_norm_ref
from .registry import define


def _correction_dim(num_rotations: float, dim: int, base: float, max_pos: int) -> float:
    return (dim * math.log(max_pos / (num_rotations * 2 * math.pi))) / (2 * math.log(base))


def yarn_inv_freq(dim: int, base: float, rs: RopeScaling) -> torch.Tensor:
    """[dim/2] float64 inverse frequencies; plain rope when rs is not yarn."""
    exps = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    extra = 1.0 / (base**exps)
    if rs.type != "yarn":
        return extra
    inter = extra / rs.factor
    low = max(math.floor(_correction_dim(rs.beta_fast, dim, base, rs.original_max_position_embeddings)), 0)
    high = min(math.ceil(_correction_dim(rs.beta_slow, dim, base, rs.original_max_position_embeddings)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep_extra = 1.0 - ramp  # low dims (fast rotation) keep the original frequency
    return inter * (1 - keep_extra) + extra * keep_extra


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [T] -> cos, sin [T, dim/2] (angles computed in float64 for exactness at 256k)."""
    ang = positions.to(torch.float64)[:, None] * inv_freq.to(positions.device)[None, :]
    return (ang.cos() * attention_factor).to(dtype), (ang.sin() * attention_factor).to(dtype)


class RopeTable:
    """rope_cos_sin's values for positions 0..n-1, computed once per dtype after reserve(n): a forward then
    gathers its rows (1 kernel) instead of computing them (8 torch ops per forward, x3 per round;
    benchmarks/op_counts.py counts the references).
    Without a reservation (training, direct forwards) the values are computed per call."""

    def __init__(self):
        self.n = 0
        self.tables: dict[torch.dtype, torch.Tensor] = {}

    def reserve(self, n: int) -> None:
        """Serve positions < n from tables (NOTE: the caller bounds its positions: no check on the device)."""
        if n > self.n:
            self.n, self.tables = n, {}

    def reset(self) -> None:
        """inv_freq changed (or moved): drop the tables, keep the reservation."""
        self.tables = {}

    def table(self, inv_freq: torch.Tensor, attention_factor: float, dtype) -> torch.Tensor:
        """The reserved positions' [cos | sin] rows [n, dim] in dtype (built on first use): one row per
        position holds both, so a forward gathers them in one launch (a 2-D gather: a [n, 2, dim/2] table
        takes torch's slower index_select kernel)."""
        if dtype not in self.tables:
            cos, sin = rope_cos_sin(torch.arange(self.n, device=inv_freq.device), inv_freq, attention_factor, dtype)
            self.tables[dtype] = torch.cat([cos, sin], -1)
        return self.tables[dtype]

    def cos_sin(self, positions: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float, dtype):
        """cos, sin [T, dim/2] (from a table: the halves of one gathered [T, dim], row stride dim)."""
        if not self.n:
            return rope_cos_sin(positions, inv_freq, attention_factor, dtype)
        both = self.table(inv_freq, attention_factor, dtype)[positions]
        return both.chunk(2, -1)


class RopeOwner:
    """rope() for a module holding `inv_freq`, `rope_table`, `cfg.rope_scaling` and `_inv_freq()` (the
    target and the drafter)."""

    def reset_rope(self, device) -> None:
        """Recompute inv_freq on `device` (a model built on the meta device has none; .to() casts it)."""
        self.inv_freq = self._inv_freq().to(device)
        self.rope_table.reset()

    def rope(self, positions: torch.Tensor, dtype):
        return self.rope_table.cos_sin(positions, self.inv_freq, self.cfg.rope_scaling.attention_factor, dtype)

    def reserve_rope(self, n: int, dtype) -> None:
        """Serve positions < n from a table, built now (so not inside a CUDA-graph capture)."""
        self.rope_table.reserve(n)
        self.rope_table.table(self.inv_freq, self.cfg.rope_scaling.attention_factor, dtype)


def apply_rope_interleaved_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: bool = False) -> torch.Tensor:
    """x [..., T, d] (or [..., T, h, d] with heads=True) with pairs (x[2i], x[2i+1]); cos/sin [T, d/2]."""
    if heads:
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


def apply_rope_half_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: bool = False) -> torch.Tensor:
    """NeoX rotate_half layout: pairs (x[i], x[i + d/2]); shapes as apply_rope_interleaved."""
    if heads:
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _rope_ref(x, cos, sin, heads, interleaved):
    return (apply_rope_interleaved_ref if interleaved else apply_rope_half_ref)(x, cos, sin, heads)


ROPE = define("rope", _rope_ref)


def apply_rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: bool = False) -> torch.Tensor:
    """The target's q_pe / k_pe (the drafter's half layout goes through rms_norm_rope_half)."""
    return ROPE(x, cos, sin, heads, True)


def rms_norm_rope_half_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor):
    """apply_rope_half_ref(rms_norm(x, weight, eps)) over heads: x [..., T, h, d], weight [d] (or [h, d]: one
    per head), cos/sin [T, d/2]."""
    return apply_rope_half_ref(rms_norm_ref(x, weight, eps), cos, sin, heads=True)


NORM_ROPE = define("norm_rope", rms_norm_rope_half_ref)


def rms_norm_rope_half(x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor):
    """The drafter's q / k: per-head RMSNorm, then the half-split rope (one launch on GPU)."""
    return NORM_ROPE(x, weight, eps, cos, sin)
