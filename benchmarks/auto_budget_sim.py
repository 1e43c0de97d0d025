"""What `--budget auto`'s choice between plain steps and trees does when trees pay a little, simulated: an
AutoBudget driven as the reply loop drives it (next_budget, choose, observe), with made-up costs instead of a
model. A plain step takes --plain-ms for one token; a tree round --tree-ms for 1 + a geometric number of tokens
whose mean makes the trees' tokens/s RATIO x the plain steps'. Prints, per ratio, the share of tree rounds after
the first --settle rounds, one figure per seed (T > 0 acceptance is noisy; the rule must take trees that pay and
leave trees that do not).

    PYTHONPATH=. python benchmarks/auto_budget_sim.py [--ratios 0.8 0.9 1.2 1.5] [--rounds 20000] [--seeds 3]
        [--tree-decay X] [--json OUT]

The defaults are GPU-like demo costs at T = 0.7 (a plain step 0.52 ms, a 16-node tree round 0.84 ms)."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

from ddtree_chat.engine import budget as budget_mod
from ddtree_chat.engine.budget import PLAIN, AutoBudget
from ddtree_chat.engine.parallel import SINGLE
from ddtree_chat.engine.tree import build_tree_ref


def flat_tree(depth: int = 7, budget: int = 16):
    """A drafter that is never sure (three candidates at 0.4 / 0.35 / 0.25 per position): the choice's tree."""
    p = torch.tensor([[0.4, 0.35, 0.25]] * depth)
    return build_tree_ref(0, p.log(), torch.arange(3).repeat(depth, 1), budget)


def tree_share(ratio: float, rounds: int, seed: int, plain_ms: float, tree_ms: float, settle: int) -> float:
    """The share of tree rounds after `settle` rounds when trees give `ratio` x plain steps' tokens/s."""
    rng = random.Random(seed)
    auto = AutoBudget(decoder=None, tp=SINGLE, key="sim")
    auto.costs, auto.plain_cost = {8: 0.95 * tree_ms / 1e3, 16: tree_ms / 1e3}, plain_ms / 1e3
    keep_going = 1 - plain_ms / (ratio * tree_ms)  # NOTE: 1 + geometric(q) tokens have mean 1 / (1 - q)
    tree, trees = flat_tree(), []
    for _ in range(rounds):
        if auto.next_budget() == PLAIN:
            auto.observe(tree.prefix(0), accepted=1, draft_s=0.0, target_s=plain_ms / 1e3)
            trees.append(0)
            continue
        n = auto.choose(tree)
        tokens = 1
        while tokens < n + 1 and rng.random() < keep_going:
            tokens += 1
        auto.observe(tree.prefix(n), accepted=tokens, draft_s=0.1 * tree_ms / 1e3, target_s=0.9 * tree_ms / 1e3)
        trees.append(1)
    late = trees[settle:]
    return sum(late) / len(late)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ratios", type=float, nargs="+", default=[0.8, 0.9, 1.2, 1.5])
    ap.add_argument("--rounds", type=int, default=20000)
    ap.add_argument("--settle", type=int, default=2000, help="rounds left out of the share (the start)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--plain-ms", type=float, default=0.52)
    ap.add_argument("--tree-ms", type=float, default=0.84)
    ap.add_argument("--tree-decay", type=float, default=None, help="try another budget.TREE_DECAY")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    if a.tree_decay is not None:
        budget_mod.TREE_DECAY = a.tree_decay
    shares = {r: [round(tree_share(r, a.rounds, s, a.plain_ms, a.tree_ms, a.settle), 4) for s in range(a.seeds)]
              for r in a.ratios}
    print(f"TREE_DECAY {budget_mod.TREE_DECAY}: share of tree rounds (one per seed) by trees' rate / plain steps'")
    for r, s in shares.items():
        print(f"  {r:.2f}x  {' '.join(f'{x:.3f}' for x in s)}")
    out = {"tree_decay": budget_mod.TREE_DECAY, "rounds": a.rounds, "settle": a.settle,
           "shares": {str(r): s for r, s in shares.items()}}
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
