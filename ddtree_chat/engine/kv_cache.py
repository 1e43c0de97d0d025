"""Owners of the target's latent KV cache and the drafter's context KV cache.

Target: slots [0, length) are committed; a forward writes its T tokens at [length, length + T) and
`commit(nodes)` keeps the chosen ones (in order) as the next committed entries.
NOTE: a committed node's depth equals its final position, so moving it needs no re-rope."""

from __future__ import annotations

import torch

from . import ops
from .errors import ContextLengthError


class KVCache:
    def __init__(self, num_layers: int, max_len: int, rank: int, rope_dim: int, dtype, device):
        self.max_len = max_len
        self.ckv = torch.zeros(num_layers, max_len, rank, dtype=dtype, device=device)
        self.kpe = torch.zeros(num_layers, max_len, rope_dim, dtype=dtype, device=device)
        self.length = 0

    def ensure_room(self, t: int) -> None:
        if self.length + t > self.max_len:
            raise ContextLengthError(
                f"the conversation needs {self.length + t} tokens but the context holds {self.max_len}; "
                "start a new chat or lower --max-new-tokens.")

    def destination(self, layer: int, t: int):
        """LatentCache: a forward's t entries go to slots length..length + t - 1."""
        self.ensure_room(t)
        return self.ckv[layer], self.kpe[layer], self.length

    def commit(self, nodes: list[int]) -> None:
        """nodes: indices (into the last forward's tokens) that become committed, in order."""
        n = len(nodes)
        if nodes != list(range(n)):  # a prefix of the forward (prefill, AR, a chain) is already in place
            src = torch.tensor(nodes, device=self.ckv.device) + self.length
            self.ckv[:, self.length : self.length + n] = self.ckv[:, src].clone()
            self.kpe[:, self.length : self.length + n] = self.kpe[:, src].clone()
        self.length += n

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)

    def advance(self, n: int) -> None:
        """Count n more rows as committed (already in place: written by a static-shape program)."""
        self.ensure_room(n)
        self.length += n

    # -- static shapes (graphs.py): slots are device tensors, the host keeps `length` ----------------
    def move_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Every layer's rows src -> dst (device [n] each), as ops.move_rows: no row may be read after
        it was written (src[j] != dst[k] for k < j)."""
        ops.move_rows(self.ckv, self.kpe, src, dst)


class DraftCache:
    """Per drafter layer, roped K and V of the context features; keeps at most `window` entries."""

    def __init__(self, num_layers: int, max_len: int, kv_heads: int, head_dim: int, dtype, device,
                 window: int | None = None):
        self.window = window
        cap = min(max_len, window) if window else max_len
        self.k = torch.zeros(num_layers, cap, kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.length = 0  # entries held (<= cap)
        self.end_pos = 0  # position one past the newest context entry

    @property
    def capacity(self) -> int:
        return self.k.shape[1]

    def make_room(self, n: int) -> None:
        """Slide the window (drop the oldest entries) so that n more fit; n <= capacity."""
        if self.length + n > self.capacity:
            keep = self.capacity - n
            self.k[:, :keep] = self.k[:, self.length - keep : self.length].clone()
            self.v[:, :keep] = self.v[:, self.length - keep : self.length].clone()
            self.length = keep

    def append(self, k: torch.Tensor, v: torch.Tensor, end_pos: int) -> None:
        """k, v [n, layers, kv, d] (DFlashDrafter.context_kv_stacked) for positions end_pos - n .. end_pos - 1."""
        n, cap = k.shape[0], self.capacity
        if n >= cap:
            self.k[:], self.v[:] = k[-cap:].transpose(0, 1), v[-cap:].transpose(0, 1)
            self.length = cap
        else:
            self.make_room(n)
            self.k[:, self.length : self.length + n] = k.transpose(0, 1)
            self.v[:, self.length : self.length + n] = v.transpose(0, 1)
            self.length += n
        self.end_pos = end_pos

    def write_slots(self, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        """Static-shape append: k, v [n, layers, kv, d] at device slots [n] (one launch each); the host
        then calls advance() with how many of them count."""
        self.k.index_copy_(1, slots, k.transpose(0, 1))
        self.v.index_copy_(1, slots, v.transpose(0, 1))

    def advance(self, n: int, end_pos: int) -> None:
        self.length += n
        self.end_pos = end_pos

    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(self.k[i, : self.length], self.v[i, : self.length]) for i in range(self.k.shape[0])]

    def truncate_to_pos(self, pos: int) -> None:
        """Drop entries at positions >= pos. NOTE: the drafter only affects speed, never the output, so
        a window that cannot cover the drop simply restarts empty."""
        drop = self.end_pos - pos
        if drop <= 0:
            return
        self.length = max(self.length - drop, 0)
        self.end_pos = pos
