"""Acceptance and speed of the demo pair on held-out prompts, T=0 (issue 7):

    python -m ddtree_chat.demo.bench [--target DIR --draft DIR] [--prompts N] [--max-new 128] [--json OUT]

Runs ar, dflash and ddtree at budgets 8/16/32/64 on the same prompts in the same process, checks that every
mode's ids equal ar's, and prints one markdown table (mean accepted length = tokens per target forward)."""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def heldout_prompts(n: int, max_user_chars: int = 600) -> list[dict]:
    """The first n test-split chat prompts (sorted by file, then order), shipped with the assets."""
    items = json.loads((HERE.parents[1] / "assets" / "demo" / "heldout_prompts.json").read_text())
    return [x for x in items if len(x["user"]) <= max_user_chars][:n]


def main(argv=None) -> int:
    from ddtree_chat.engine import Engine, GenerationConfig
    from ddtree_chat.engine.default_model import shipped_demo_dirs

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--budgets", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    target, draft = (a.target, a.draft) if a.target else shipped_demo_dirs()
    eng = Engine.load(target, draft, device="cpu")
    prompts = heldout_prompts(a.prompts)
    runs = [("ar", 0)] + [("dflash", 7)] + [("ddtree", b) for b in a.budgets]
    # warm-up (allocations, first-call overheads)
    for mode, b in runs:
        for _ in eng.generate(prompts[0]["prompt_ids"], GenerationConfig(mode=mode, budget=max(b, 1), max_new_tokens=8)):
            pass
    res = {f"{m}-{b}": {"tokens": 0, "forwards": 0, "seconds": 0.0, "mismatch": 0} for m, b in runs}
    ar_ids = []
    for i, p in enumerate(prompts):
        for mode, b in runs:
            cfg = GenerationConfig(mode=mode, budget=max(b, 1), max_new_tokens=a.max_new)
            t0 = time.perf_counter()
            for ev in eng.generate(p["prompt_ids"], cfg):
                pass
            dt = time.perf_counter() - t0
            r = res[f"{mode}-{b}"]
            r["tokens"] += len(ev["token_ids"])
            r["forwards"] += ev["target_forwards"]
            r["seconds"] += dt
            if mode == "ar":
                ar_ids.append(ev["token_ids"])
            elif ev["token_ids"] != ar_ids[i]:
                r["mismatch"] += 1
    ar = res["ar-0"]
    ar_tps = ar["tokens"] / ar["seconds"]
    lines = ["| mode | budget | mean accepted length | tokens/s | speedup vs ar | ids == ar |",
             "|---|---|---|---|---|---|"]
    for mode, b in runs:
        r = res[f"{mode}-{b}"]
        r["mean_accepted_length"] = r["tokens"] / r["forwards"]
        r["tokens_per_second"] = r["tokens"] / r["seconds"]
        r["speedup"] = r["tokens_per_second"] / ar_tps
        lines.append(f"| {mode} | {b if mode != 'ar' else '-'} | {r['mean_accepted_length']:.2f} | "
                     f"{r['tokens_per_second']:.1f} | {r['speedup']:.2f}x | "
                     f"{'yes' if r['mismatch'] == 0 else 'NO (%d)' % r['mismatch']} |")
    table = "\n".join(lines)
    print(f"{len(prompts)} held-out prompts, max_new_tokens {a.max_new}, T=0, CPU float32, "
          f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}")
    print(table)
    if a.json:
        a.json.write_text(json.dumps({"prompts": len(prompts), "max_new": a.max_new,
                                      "threads": torch.get_num_threads(), "results": res}, indent=1))
    return 0 if all(r["mismatch"] == 0 for r in res.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
