"""Draft trees (reference implementations; docs/architecture.md, the tree): best-first construction over the drafter's
per-depth top-K log-probabilities, the ancestor mask, the target's choice per node and the verify walk.

Node 0 is the root (the bonus token, already verified); nodes are numbered in pop order, so a parent
always precedes its children. `budget` counts the drafted nodes, the root excluded."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .ops.registry import define


@dataclass
class DraftTree:
    tokens: torch.Tensor  # [N] int64
    parents: torch.Tensor  # [N] int64, -1 for the root
    depth: torch.Tensor  # [N] int64, root 0
    logprobs: torch.Tensor  # [N] float32: drafter log-prob of each node's token at its depth (root 0)
    max_depth: int | None = None  # a host-side bound on depth, so loops over depth need no device sync

    @property
    def depth_bound(self) -> int:
        return self.max_depth if self.max_depth is not None else int(self.depth.max())

    @property
    def size(self) -> int:
        return int(self.tokens.numel())

    def positions(self, start: int) -> torch.Tensor:
        return self.depth + start

    def mask(self) -> torch.Tensor:
        """[N, N] bool: row i sees column j iff j is i or an ancestor of i (on the tree's device, no sync)."""
        return ANCESTOR_MASK.on(self.parents, self)

    def mask_ref(self) -> torch.Tensor:
        n = self.size
        rows = torch.arange(n, device=self.parents.device)
        m = torch.eye(n, dtype=torch.bool, device=self.parents.device)
        anc = self.parents
        for _ in range(self.depth_bound if n > 1 else 0):  # NOTE: one step up the tree per pass
            ok = anc >= 0
            m[rows, anc.clamp(min=0)] |= ok
            anc = torch.where(ok, self.parents[anc.clamp(min=0)], anc)
        return m

    def prefix(self, budget: int) -> "DraftTree":
        """The first `budget` drafted nodes: best-first order makes them the top-budget prefixes."""
        n = budget + 1
        return DraftTree(self.tokens[:n], self.parents[:n], self.depth[:n], self.logprobs[:n], self.max_depth)


def root_only(token: int, device=None) -> DraftTree:
    z = torch.zeros(1, dtype=torch.int64, device=device)
    return DraftTree(torch.tensor([token], device=device), torch.tensor([-1], device=device), z,
                     torch.zeros(1, device=device), max_depth=0)


def build_tree(root_token: torch.Tensor | int, top_logp: torch.Tensor, top_ids: torch.Tensor,
               budget: int, out: tuple[torch.Tensor, ...] | None = None) -> DraftTree:
    """build_tree_ref, through the one-program GPU kernel where one is registered (ops/triton_tree).
    out: (tokens, parents, depth, logprobs) buffers of budget + 1 the kernel writes into (the graphs'
    static tree: no copies); the reference ignores them (the caller copies)."""
    built = BUILD_TREE.on(top_logp, root_token, top_logp, top_ids, budget, out)
    return built if isinstance(built, DraftTree) else DraftTree(*built, max_depth=min(top_logp.shape[0], budget))


def build_tree_ref(root_token: torch.Tensor | int, top_logp: torch.Tensor, top_ids: torch.Tensor,
                   budget: int) -> DraftTree:
    """top_logp/top_ids [D, K] (ranks sorted by descending log-prob at each depth) -> the `budget` most
    probable prefixes under the product of marginals (tests/tree_oracle.py finds the same ones best-first
    with a heap), with tensor ops only (no host sync), so it runs on the GPU: keep the best `budget`
    prefixes per depth (a top-budget prefix of depth d must be among them), then take the best `budget` over all depths. Since every log-prob is <= 0 a parent
    scores at least as high as its children, and a stable sort over depth-ordered candidates puts it
    first on ties, so the selection is prefix-closed and parents precede children."""
    dev = top_logp.device
    depth_max, k = top_logp.shape
    scores, parents, tokens, depths = [], [], [], []
    prev = torch.zeros(1, device=dev)  # the root's score
    for d in range(depth_max):
        cand = (prev[:, None] + top_logp[d][None, :]).flatten()  # [kept_{d-1} * K]
        keep = min(budget, cand.numel())
        sc, idx = cand.topk(keep)
        scores.append(sc)
        parents.append(idx // k)  # index among depth d-1's kept prefixes
        tokens.append(top_ids[d][idx % k])
        depths.append(torch.full((keep,), d + 1, device=dev, dtype=torch.long))
        prev = sc
    offsets = [0]
    for sc in scores:
        offsets.append(offsets[-1] + sc.numel())
    all_scores = torch.cat(scores)
    order = torch.sort(all_scores, descending=True, stable=True).indices[:budget]
    node_of = torch.full((all_scores.numel(),), -1, dtype=torch.long, device=dev)
    node_of[order] = torch.arange(1, order.numel() + 1, device=dev)
    # candidate -> global index of its parent candidate (depth-1 candidates hang off the root)
    parent_cand = torch.cat([torch.full_like(parents[0], -1)] + [p + offsets[d] for d, p in enumerate(parents[1:])])
    parent_node = torch.where(parent_cand >= 0, node_of[parent_cand.clamp(min=0)], torch.zeros_like(parent_cand))
    own = all_scores - torch.where(parent_cand >= 0, all_scores[parent_cand.clamp(min=0)], torch.zeros_like(all_scores))
    root = torch.as_tensor(root_token, device=dev, dtype=torch.long).reshape(1)
    neg = torch.full((1,), -1, dtype=torch.long, device=dev)
    return DraftTree(torch.cat([root, torch.cat(tokens)[order]]), torch.cat([neg, parent_node[order]]),
                     torch.cat([torch.zeros(1, dtype=torch.long, device=dev), torch.cat(depths)[order]]),
                     torch.cat([torch.zeros(1, device=dev), own[order]]).float(), max_depth=min(depth_max, budget))


def walk_topk(tree: DraftTree, choice: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The walk (tests/tree_oracle.walk) with tensor ops: (accepted mask [N], bonus token []) on the tree's device. A node is accepted
    iff its parent is and the target chose its token there; siblings hold distinct tokens, so at most one
    node per depth is accepted and the accepted nodes form the path."""
    return WALK.on(tree.parents, tree, choice)


def walk_topk_ref(tree: DraftTree, choice: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    parent = tree.parents.clamp(min=0)
    hit = (choice[parent] == tree.tokens) | (tree.parents < 0)
    ok = hit.clone()
    for _ in range(tree.depth_bound if tree.size > 1 else 0):
        ok = hit & (ok[parent] | (tree.parents < 0))
    deepest = torch.where(ok, tree.depth, -1).argmax().view(1)  # NOTE: a 0-dim index would sync (item())
    return ok, choice[deepest].view(())


def walk_commit(tree: DraftTree, choice: torch.Tensor, state: torch.Tensor, drafting: bool):
    """walk_topk plus the round's bookkeeping, for the graphs' accept: state [3] int64 (committed length,
    drafter entries, root token) -> (ok [N], bonus [], path [D + 1]: the accepted node at each depth, node 0
    past the path's end, slots [3, D + 1]: length + path, length + depth, entries + depth), and state
    advanced in place (length and, when drafting, entries by the accepted count; root = bonus)."""
    return WALK_COMMIT.on(tree.parents, tree, choice, state, drafting)


def walk_commit_ref(tree: DraftTree, choice: torch.Tensor, state: torch.Tensor, drafting: bool):
    ok, bonus = walk_topk(tree, choice)
    levels = torch.arange(tree.depth_bound + 1, device=tree.depth.device)
    at_level = ok[None, :] & (tree.depth[None, :] == levels[:, None])  # [D + 1, N]
    path = at_level.int().argmax(-1)
    slots = torch.stack([state[0] + path, state[0] + levels, state[1] + levels])
    count = ok.sum()
    state[0] += count
    if drafting:
        state[1] += count
    state[2] = bonus
    return ok, bonus, path, slots


def path_scores(tree: DraftTree) -> torch.Tensor:
    """[N] summed drafter log-prob from the root to each node (root 0), on the tree's device."""
    parent = tree.parents.clamp(min=0)
    out = tree.logprobs.clone()
    for _ in range(tree.depth_bound - 1 if tree.size > 1 else 0):  # one level per pass
        out = tree.logprobs + torch.where(tree.parents > 0, out[parent], torch.zeros_like(out))
    return out


def pack_round_ref(tree: DraftTree, choice: torch.Tensor, ok: torch.Tensor, bonus: torch.Tensor) -> torch.Tensor:
    """[6N + 1] float64: tokens, parents, depth, draft log-probs, target choices, accepted flags, bonus."""
    parts = (tree.tokens, tree.parents, tree.depth, tree.logprobs, choice, ok, bonus.view(1))
    return torch.cat([t.double().view(-1) for t in parts])


def pack_round(tree: DraftTree, choice: torch.Tensor, ok: torch.Tensor, bonus: torch.Tensor) -> torch.Tensor:
    """pack_round_ref (eight launches as torch ops: a cast per part and the concatenation; one kernel)."""
    return PACK_ROUND.on(tree.tokens, tree, choice, ok, bonus)


# NOTE: the round's ops on the tree (kernels: ops/triton_tree.py); build_tree's kernel returns the four
# tensors, its reference (the `out` buffers ignored: the caller copies) the DraftTree
ANCESTOR_MASK = define("ancestor_mask", DraftTree.mask_ref)
BUILD_TREE = define("build_tree", lambda root, top_logp, top_ids, budget, out=None: build_tree_ref(root, top_logp, top_ids, budget))
WALK = define("walk", walk_topk_ref)
WALK_COMMIT = define("walk_commit", walk_commit_ref)
PACK_ROUND = define("pack_round", pack_round_ref)
