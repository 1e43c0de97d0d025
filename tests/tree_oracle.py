"""The draft tree's test oracles: the heap builder (best-first search over the product of marginals, the
definition tree.build_tree and its Triton kernel are tested against), the list-based walk the tensor walk is
checked with, and the bit-packed ancestor mask. Tests and benchmarks only (benchmarks/draft_tau.py)."""

from __future__ import annotations

import heapq

import torch

from ddtree_chat.engine.tree import DraftTree


def build_tree_heap(root_token: int, top_logp: torch.Tensor, top_ids: torch.Tensor, budget: int) -> DraftTree:
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


def children(tree: DraftTree) -> list[list[int]]:
    kids: list[list[int]] = [[] for _ in range(tree.size)]
    for i, p in enumerate(tree.parents.tolist()):
        if p >= 0:
            kids[p].append(i)
    return kids


def walk(tree: DraftTree, choice: torch.Tensor) -> tuple[list[int], int]:
    """Follow the target's choices from the root. Returns (accepted node path, root first; bonus token)."""
    kids = children(tree)
    toks = tree.tokens.tolist()
    picks = choice.tolist()
    cur, path = 0, [0]
    while True:
        nxt = next((c for c in kids[cur] if toks[c] == picks[cur]), None)
        if nxt is None:
            return path, picks[cur]
        cur = nxt
        path.append(cur)


def packed_mask(tree: DraftTree) -> torch.Tensor:
    """[N, ceil(N/64)] int64 bit form of tree.mask(): bit j % 64 of word j // 64."""
    m = tree.mask()
    n = tree.size
    words = (n + 63) // 64
    padded = torch.zeros(n, words * 64, dtype=torch.int64)
    padded[:, :n] = m.to(torch.int64)
    bits = padded.view(n, words, 64) << torch.arange(64, dtype=torch.int64)
    return bits.sum(-1)  # wraps into the sign bit for j % 64 == 63, as int64 two's complement
