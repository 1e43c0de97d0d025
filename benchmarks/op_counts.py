"""How many torch ops (each one kernel launch on a GPU) the pure-torch references issue per call, for the
ops that have a one- or two-launch Triton kernel: the figures the kernels' docstrings quote. CPU only,
counted with a dispatch mode (views excluded), at the demo pair's shapes.

    python benchmarks/op_counts.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VIEWS = {"view", "_unsafe_view", "slice", "select", "unsqueeze", "squeeze", "expand", "transpose", "permute", "t",
         "alias", "as_strided", "unflatten", "detach", "_reshape_alias", "split", "unbind", "lift_fresh"}


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ not in VIEWS:
            self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def count(fn) -> list[str]:
    """The non-view torch ops fn() dispatches, in order."""
    c = _Count()
    with c:
        fn()
    return c.ops


def references(depth: int = 7) -> dict[str, list[str]]:
    """Reference op name -> the ops one call issues (demo shapes; the tree ones for a depth-`depth` tree)."""
    from ddtree_chat.engine.config import RopeScaling
    from ddtree_chat.engine.ops import (apply_rope_half_ref, apply_rope_interleaved_ref, draft_attention_ref,
                                        matmul_nt_glu_ref, rope_cos_sin, yarn_inv_freq)
    from ddtree_chat.engine.tree import build_tree_ref, walk_topk_ref

    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    q_pe, cs = r(33, 4, 48)[..., 32:], r(33, 8)  # the demo target's rope slice of q
    inv = yarn_inv_freq(16, 5e4, RopeScaling(type="yarn", factor=32.0, original_max_position_embeddings=1024))
    pos = torch.arange(33)
    q, kc, kb = r(8, 4, 64), r(300, 2, 64), r(8, 2, 64)  # the demo drafter's block over 300 entries
    mask, cs8 = torch.ones(8, 308, dtype=torch.bool), r(8, 32)
    x, wg, wu = r(33, 256), r(128, 256), r(128, 256)
    lp = torch.log_softmax(r(depth, 100), -1).topk(32, -1)
    tree = build_tree_ref(torch.tensor([5]), lp.values, lp.indices, 32)
    tree.max_depth = depth
    return {
        "apply_rope_interleaved_ref": count(lambda: apply_rope_interleaved_ref(q_pe, cs, cs, True)),
        "apply_rope_half_ref": count(lambda: apply_rope_half_ref(q, cs8, cs8, True)),
        "rope_cos_sin": count(lambda: rope_cos_sin(pos, inv, 1.0, torch.float32)),
        "draft_attention_ref": count(lambda: draft_attention_ref(q, kc, kc, kb, kb, mask, 0.125)),
        "matmul_nt_glu_ref": count(lambda: matmul_nt_glu_ref(x, wg, wu)),
        f"DraftTree.mask_ref (depth {depth})": count(tree.mask_ref),
        f"walk_topk_ref (depth {depth})": count(lambda: walk_topk_ref(tree, tree.tokens)),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    refs = references()
    print("| reference | torch ops per call | ops |\n|---|---|---|")
    for name, ops in refs.items():
        print(f"| {name} | {len(ops)} | {' '.join(ops)} |")
    if a.json:
        a.json.write_text(json.dumps({k: len(v) for k, v in refs.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
