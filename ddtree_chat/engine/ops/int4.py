"""INT4 group-quantized weights in the compressed-tensors pack-quantized layout (docs/architecture.md).

Element k of a row sits in int32 word k // 8 at bits 4*(k % 8) .. +3 (lowest nibble first), stored as q + 8."""

from __future__ import annotations

from dataclasses import dataclass

import torch

_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """int32 [..., n/8] -> int8 codes q in [-8, 7], shape [..., n]."""
    nib = (packed.unsqueeze(-1) >> _SHIFTS.to(packed.device)) & 0xF
    return (nib.flatten(-2) - 8).to(torch.int8)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """int codes in [-8, 7], shape [..., n] (n % 8 == 0) -> int32 [..., n/8]."""
    u = (q.to(torch.int64) + 8).view(*q.shape[:-1], q.shape[-1] // 8, 8)
    word = (u << _SHIFTS.to(torch.int64).to(q.device)).sum(-1)
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def dequant_int4(packed: torch.Tensor, scale: torch.Tensor, group_size: int, dtype=torch.float32) -> torch.Tensor:
    """w[n, k] = q[n, k] * scale[n, k // group_size]; packed [..., out, in/8], scale [..., out, in/g]."""
    q = unpack_int4(packed).to(dtype)
    s = scale.to(dtype).repeat_interleave(group_size, dim=-1)
    return q * s


def quantize_int4(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric round-to-nearest: w [..., out, in] -> (packed int32, scale) as stored on disk."""
    g = w.float().unflatten(-1, (w.shape[-1] // group_size, group_size))
    scale = (g.abs().amax(-1) / 7.0).clamp_min(1e-8)
    q = torch.round(g / scale.unsqueeze(-1)).clamp(-8, 7).flatten(-2)
    return pack_int4(q), scale


@dataclass
class Int4Weight:
    """A stack of INT4 matrices [E, out, in] kept packed (as on disk) until a kernel repacks them."""

    packed: torch.Tensor  # int32 [E, out, in/8]
    scale: torch.Tensor  # [E, out, in/group]
    group_size: int

    @property
    def shape(self) -> tuple[int, int, int]:
        e, out, words = self.packed.shape
        return e, out, words * 8

    def dequant(self, expert: int, dtype) -> torch.Tensor:
        return dequant_int4(self.packed[expert], self.scale[expert], self.group_size, dtype)
