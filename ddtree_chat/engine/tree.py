"""Draft trees (reference implementations, DESIGN 3.2-3.3): best-first construction over the drafter's
per-depth top-K log-probabilities, the ancestor mask, the target's choice per node and the verify walk.

Node 0 is the root (the bonus token, already verified); nodes are numbered in pop order, so a parent
always precedes its children. `budget` counts the drafted nodes, the root excluded."""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch


@dataclass
class DraftTree:
    tokens: torch.Tensor  # [N] int64
    parents: torch.Tensor  # [N] int64, -1 for the root
    depth: torch.Tensor  # [N] int64, root 0
    logprobs: torch.Tensor  # [N] float32: drafter log-prob of each node's token at its depth (root 0)

    @property
    def size(self) -> int:
        return int(self.tokens.numel())

    def positions(self, start: int) -> torch.Tensor:
        return self.depth + start

    def mask(self) -> torch.Tensor:
        """[N, N] bool: row i sees column j iff j is i or an ancestor of i."""
        n = self.size
        m = torch.eye(n, dtype=torch.bool)
        parents = self.parents.tolist()
        for i in range(1, n):
            m[i] |= m[parents[i]]  # NOTE: parents precede children, so the parent's row is complete
        return m

    def packed_mask(self) -> torch.Tensor:
        """[N, ceil(N/64)] int64 bit form of mask(): bit j % 64 of word j // 64."""
        m = self.mask()
        n = self.size
        words = (n + 63) // 64
        padded = torch.zeros(n, words * 64, dtype=torch.int64)
        padded[:, :n] = m.to(torch.int64)
        bits = padded.view(n, words, 64) << torch.arange(64, dtype=torch.int64)
        return bits.sum(-1)  # wraps into the sign bit for j % 64 == 63, as int64 two's complement

    def prefix(self, budget: int) -> "DraftTree":
        """The first `budget` drafted nodes: best-first order makes them the top-budget prefixes."""
        n = budget + 1
        return DraftTree(self.tokens[:n], self.parents[:n], self.depth[:n], self.logprobs[:n])

    def children(self) -> list[list[int]]:
        kids: list[list[int]] = [[] for _ in range(self.size)]
        for i, p in enumerate(self.parents.tolist()):
            if p >= 0:
                kids[p].append(i)
        return kids


def root_only(token: int) -> DraftTree:
    z = torch.zeros(1, dtype=torch.int64)
    return DraftTree(torch.tensor([token]), torch.tensor([-1]), z, torch.zeros(1))


def build_tree(root_token: int, top_logp: torch.Tensor, top_ids: torch.Tensor, budget: int) -> DraftTree:
    """top_logp/top_ids [D, K] (ranks sorted by descending log-prob at each depth) -> the `budget` most
    probable prefixes under the product of marginals, found best-first with a heap."""
    depth_max, k = top_logp.shape
    lp = top_logp.tolist()
    ids = top_ids.tolist()
    tokens, parents, depths, logps = [root_token], [-1], [0], [0.0]
    node_of: dict[tuple[int, ...], int] = {(): 0}
    heap: list[tuple[float, tuple[int, ...]]] = [(-lp[0][0], (0,))] if depth_max and k and budget > 0 else []
    while heap and len(tokens) - 1 < budget:
        neg, ranks = heapq.heappop(heap)
        d = len(ranks)
        node_of[ranks] = len(tokens)
        tokens.append(ids[d - 1][ranks[-1]])
        parents.append(node_of[ranks[:-1]])
        depths.append(d)
        logps.append(lp[d - 1][ranks[-1]])
        score = -neg
        if ranks[-1] + 1 < k:  # next sibling: same prefix, next rank
            sib = ranks[:-1] + (ranks[-1] + 1,)
            heapq.heappush(heap, (-(score - lp[d - 1][ranks[-1]] + lp[d - 1][ranks[-1] + 1]), sib))
        if d < depth_max:  # first child
            heapq.heappush(heap, (-(score + lp[d][0]), ranks + (0,)))
    return DraftTree(torch.tensor(tokens), torch.tensor(parents), torch.tensor(depths),
                     torch.tensor(logps, dtype=torch.float32))


def chain(root_token: int, top_logp: torch.Tensor, top_ids: torch.Tensor) -> DraftTree:
    """The DFlash baseline: the argmax token at every depth."""
    return build_tree(root_token, top_logp[:, :1], top_ids[:, :1], top_logp.shape[0])


def target_choice(logits: torch.Tensor, temperature: float, top_p: float,
                  generator: torch.Generator | None) -> torch.Tensor:
    """logits [N, V] float32 -> the target's token at each node: argmax at T=0, else a seeded sample
    from the tempered, top-p filtered distribution."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sp, si = probs.sort(-1, descending=True)
        drop = sp.cumsum(-1) - sp > top_p  # keep the smallest prefix whose mass reaches top_p
        sp = sp.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, si, sp)
    return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1).to(logits.device)


def walk(tree: DraftTree, choice: torch.Tensor) -> tuple[list[int], int]:
    """Follow the target's choices from the root. Returns (accepted node path, root first; bonus token)."""
    kids = tree.children()
    toks = tree.tokens.tolist()
    picks = choice.tolist()
    cur, path = 0, [0]
    while True:
        nxt = next((c for c in kids[cur] if toks[c] == picks[cur]), None)
        if nxt is None:
            return path, picks[cur]
        cur = nxt
        path.append(cur)
