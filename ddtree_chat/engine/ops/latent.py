"""The MLA latent cache write: RMSNorm of c_kv, interleaved rope of k_pe, both stored at the forward's
cache slots. Per layer and forward that is five launches as separate ops (norm, its input copy, rope, two
index copies); the kernel (triton_latent.py) does it in one. And the accepted path's move to consecutive
slots (four launches as index ops for every layer, one kernel)."""

from __future__ import annotations

import torch

from .norm import rms_norm_ref
from .registry import define
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


LATENT_WRITE = define("latent_write", latent_write_ref)


def latent_write(kv, weight, eps, cos, sin, ckv_buf, kpe_buf, where):
    return LATENT_WRITE(kv, weight, eps, cos, sin, ckv_buf, kpe_buf, where)


def move_rows_ref(ckv: torch.Tensor, kpe: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Every layer's cache rows src -> dst: ckv [L, S, r], kpe [L, S, p]; src, dst device [n] (all rows are
    read before any is written)."""
    ckv.index_copy_(1, dst, ckv.index_select(1, src))
    kpe.index_copy_(1, dst, kpe.index_select(1, src))


MOVE_ROWS = define("move_rows", move_rows_ref)


def move_rows(ckv: torch.Tensor, kpe: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """move_rows_ref for moves in which no row is read after it was written (src[j] != dst[k] for k < j),
    as a path's rows moved down to consecutive slots: the kernel moves them one after another."""
    MOVE_ROWS(ckv, kpe, src, dst)
