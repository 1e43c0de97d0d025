"""The draft tree's heap oracle: best-first search over the product of marginals, the definition that
tree.build_tree (tensor ops) and its Triton kernel are tested against."""

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
