"""The row-invariant float32 product's tile (ops/triton_exact_linear.FP32_TILE: every float32 product on the GPU's
exact path, all of the demo target's) swept where it matters, the demo's recorded verify: for each candidate tile,
a fresh set of recorded programs and the best of --repeats verifies of 1 node (a plain step, no drafter features)
and of each --sizes node count (graphs.verify_seconds: the auto budget's cost curve, a star of varied tokens). The
tiles run in turn, then again in reverse order, in one process: drift shows as a difference between the passes.
BLOCK_M stays 16 (the FFMA form's sums are laid out by the block, so one height serves every row count).

    PYTHONPATH=. python benchmarks/fp32_tiles.py [--sizes 9 17 33 65] [--repeats 20] [--passes 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_round import verify_costs  # noqa: E402

from ddtree_chat.engine.ops import triton_exact_linear as el  # noqa: E402

# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, split multiplier): the broadcast [16, BLOCK_K, BLOCK_N] at <= 64
# float32 values a thread (the shipped tile's), so none should spill
TILES = [el.FP32_TILE, (16, 8, 128, 8, 1, 1.0), (16, 16, 64, 8, 1, 1.0), (16, 32, 32, 8, 1, 1.0),
         (16, 4, 128, 4, 1, 1.0), (16, 8, 64, 4, 1, 1.0), (16, 2, 256, 4, 1, 1.0), (16, 4, 128, 8, 1, 1.0)]


def main(argv=None) -> int:
    from ddtree_chat.dev.demo.common import heldout_prompts
    from ddtree_chat.engine import Engine, GenerationConfig
    from ddtree_chat.engine.default_model import shipped_demo_dirs
    from ddtree_chat.engine.graphs import StaticRound

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[9, 17, 33, 65])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--passes", type=int, choices=[1, 2], default=2, help="1: the tiles once, in order")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    eng = Engine.load(*shipped_demo_dirs(), device="cuda", graphs=True)
    for _ in eng.generate(heldout_prompts(1)[0]["prompt_ids"], GenerationConfig(mode="ddtree", budget=32,
                                                                                max_new_tokens=64)):
        pass  # a committed context of a real reply for the verifies to attend to
    dec, shipped, rows = eng.decoder, el.FP32_TILE, []
    try:
        for order in (TILES, TILES[::-1])[: a.passes]:
            for tile in order:
                el.FP32_TILE = tile
                dec.graphs = StaticRound(dec, capture=True)  # NOTE: programs recorded anew with this tile
                print(f"tile {tile}", flush=True)
                rows.append({"tile": tile, "ms": verify_costs(dec.graphs, a.sizes, a.repeats)})
    finally:
        el.FP32_TILE = shipped
    keys = ["plain"] + [str(n) for n in a.sizes]
    passes = ", pass 1 / pass 2" if a.passes == 2 else ""
    print(f"\n{torch.cuda.get_device_name()}, context {dec.cache.length} tokens; ms{passes}")
    print("| tile (M, N, K, warps, stages, split x) | " + " | ".join(keys) + " |")
    print("|---|" + "---:|" * len(keys))
    for tile in TILES:
        runs = [r["ms"] for r in rows if r["tile"] == tile]
        print(f"| {tile} | " + " | ".join(" / ".join(f"{ms[k]:.3f}" for ms in runs) for k in keys) + " |")
    if a.json:
        a.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
