"""Test helpers: drafters built from the target itself (they replace the decoder's drafter
distributions), and a tree-mask oracle."""

from __future__ import annotations

import torch


class TargetDrafter:
    """Puts (almost) all mass on the target's greedy continuation. With `noise`, every depth whose
    (position * 7919 + seed) % 100 < noise*100 ranks a wrong token first instead (so paths get cut and
    siblings matter). Used as `decoder.block_logits = TargetDrafter(engine, ...)` (the root comes as the
    block's first token); it reads the host's committed tokens, so rounds must not run ahead."""

    def __init__(self, engine, noise: float = 0.0, seed: int = 0, useless: bool = False):
        self.engine, self.noise, self.seed, self.useless = engine, noise, seed, useless

    def __call__(self, root, *static_args) -> torch.Tensor:
        if torch.is_tensor(root):  # block_logits(block, positions, ctx, mask)
            root = int(root[0])
        eng = self.engine
        dec = eng.decoder
        seq = list(dec.tokens) + [root]
        depth = dec.dcfg.block_size - 1
        vocab = eng.tcfg.vocab_size
        logp = torch.full((depth, vocab), -30.0)
        for d in range(depth):
            greedy = int(eng.logits(seq)[-1].argmax())
            pos = len(seq)
            wrong = (greedy + 1 + (pos * 31 + self.seed) % (vocab - 1)) % vocab
            if self.useless:
                logp[d, wrong] = 0.0
            elif (pos * 7919 + self.seed) % 100 < self.noise * 100:
                logp[d, wrong], logp[d, greedy] = -0.1, -2.5
            else:
                logp[d, greedy], logp[d, wrong] = -0.05, -3.0
            seq.append(greedy)
        return torch.log_softmax(logp, -1)


def closure_mask(parents: list[int]) -> torch.Tensor:
    """[N, N] bool: row i sees j iff j is i or an ancestor (parents[root] = -1), by walking up: a test oracle."""
    n = len(parents)
    m = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            m[i, j] = True
            j = parents[j]
    return m
