"""The repeat penalty (llama.cpp's rule): a token among the last REPEAT_WINDOW of the sequence gets its logit
divided by the penalty where positive, else multiplied by it. A tree node's sequence is the committed tokens, then
its own path from the root, so each node's logits are what a plain step at its position gets and speculative
output stays plain decoding's. The committed tokens live on the device (RecentTokens), so a round launched ahead
reads the ones the round before it committed without waiting for the host."""

from __future__ import annotations

import torch

from .tree import DraftTree


def repeat_penalize(logits: torch.Tensor, history: torch.Tensor, tree: DraftTree, penalty: float | torch.Tensor,
                    window: int, skip: torch.Tensor | int = 0) -> torch.Tensor:
    """logits [N, V]: node i's next-token logits; history [H <= window]: the tokens before the root, oldest first,
    the first `skip` of them none (a sequence shorter than the window); penalty: a number, or [1] on the device
    (a recorded program reads it there) -> [N, V]."""
    n, v = logits.shape
    h = history.shape[0]
    depth = tree.depth
    # each node's window: its path's last `window` tokens, then the history's last window - (depth + 1)
    from_h = torch.maximum((h - (window - depth - 1)).clamp(max=h), torch.as_tensor(skip, device=logits.device))
    keep = torch.cat([torch.arange(h, device=logits.device)[None, :] >= from_h[:, None],
                      tree.mask() & (depth[None, :] > depth[:, None] - window)], 1)  # [N, H + N]
    idx = torch.cat([history[None, :].expand(n, h), tree.tokens[None, :].expand(n, n)], 1)
    vals = logits.gather(1, idx)
    out = torch.cat([logits, logits.new_zeros(n, 1)], 1)  # NOTE: a token left out writes column V, dropped below
    # a token in the window twice writes the same value twice: the order of the writes cannot matter
    out.scatter_(1, torch.where(keep, idx, v), torch.where(vals > 0, vals / penalty, vals * penalty))
    return out[:, :v]


class RecentTokens:
    """The last `window` committed tokens on the device, by position: position p in slot p % window (slot
    `window` takes the writes to drop)."""

    def __init__(self, window: int, device: torch.device):
        self.window = window
        self.ring = torch.zeros(window + 1, dtype=torch.long, device=device)
        self._slots = torch.arange(window, device=device)

    def write(self, tokens: list[int]) -> None:
        """The host's committed tokens (a fresh round's state)."""
        dev, last = self.ring.device, torch.tensor(tokens[-self.window:], dtype=torch.long)
        pos = torch.arange(len(tokens) - len(last), len(tokens), device=dev)
        # NOTE: from pinned memory, so the copy does not make the host wait for the GPU's queue
        self.ring[pos % self.window] = last.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else last

    def history(self, length: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """length [1] (device): (the tokens at positions length - window .. length - 1 [window], how many of the
        first are before position 0)."""
        return self.ring[(length - self.window + self._slots) % self.window], (self.window - length).clamp(min=0)

    def commit(self, length: torch.Tensor, tree: DraftTree, accepted: torch.Tensor) -> None:
        """A round's accepted nodes, committed at length + depth (length [1]: the round's committed length); of a
        path longer than the window only its last `window` nodes, so no two writes share a slot."""
        last = accepted & (tree.depth + self.window >= accepted.sum())  # NOTE: the path's depths are 0 .. count - 1
        self.ring.scatter_(0, torch.where(last, (length + tree.depth) % self.window, self.window), tree.tokens)
