"""The MLA latent cache write: RMSNorm of c_kv, interleaved rope of k_pe, both stored at the forward's
cache slots. Per layer and forward that is five launches as separate ops (norm, its input copy, rope, two
index copies); the kernel (triton_latent.py) does it in one."""

from __future__ import annotations

import torch

from .norm import rms_norm_ref
from .registry import dispatch
from .rope import apply_rope_interleaved_ref


def _store(buf: torch.Tensor, where, rows: torch.Tensor) -> None:
    if torch.is_tensor(where):
        buf.index_copy_(-2, where, rows)
    else:
        buf[..., where : where + rows.shape[-2], :] = rows


def latent_write_ref(kv: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor,
                     ckv_buf: torch.Tensor, kpe_buf: torch.Tensor, where) -> tuple[torch.Tensor, torch.Tensor]:
    """kv [..., T, r + p] (the kv_a projection), weight [r], cos/sin [T, p/2]; ckv_buf [..., S, r] and
    kpe_buf [..., S, p] get rms_norm(kv[..., :r]) and rope(kv[..., r:]) at rows `where` (an int: the first of
    T consecutive slots; or a device index tensor [T]). Returns the two buffers."""
    r = weight.shape[0]
    _store(ckv_buf, where, rms_norm_ref(kv[..., :r], weight, eps).to(ckv_buf.dtype))
    _store(kpe_buf, where, apply_rope_interleaved_ref(kv[..., r:], cos, sin).to(kpe_buf.dtype))
    return ckv_buf, kpe_buf


def latent_write(kv, weight, eps, cos, sin, ckv_buf, kpe_buf, where):
    return dispatch("latent_write", kv, latent_write_ref, kv, weight, eps, cos, sin, ckv_buf, kpe_buf, where)
