"""Prompt sets by kind of task, for `benchmarks/e2e.py --prompts-json`: how well a drafter guesses replies to
requests its target trained on, to new ones, and to the held-out requests (docs/demo-training.md, "Acceptance by
kind of task"). Each set holds n requests in the held-out requests' chat prompt, tokenised by the target's tokenizer:

- heldout.json: the first n held-out requests (assets/demo/heldout_prompts.json);
- known.json: the first n of `draft_requests.everyday_requests(7, set())`, everyday tasks the shipped targets
  trained on, in any phrasing;
- novel.json: n distinct tasks of the committed self-instruct set (training/demo-distil-self.tar.xz), which a
  target trained without it (`SELF=0`, as the shipped one) never saw, in a seeded order.

    python -m ddtree_chat.dev.demo.kind_prompts --out DIR [--target DIR] [-n 20]
    python benchmarks/e2e.py --device cpu --prompts 20 --budgets 16 --threads 1 --prompts-json DIR/novel.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tarfile
from pathlib import Path

from ...engine.default_model import DEMO_DIR
from .data import Encoder
from .draft_requests import everyday_requests
from .prompts import HELDOUT_NAMES

ROOT = Path(__file__).resolve().parents[3]
SELF_SET = ROOT / "training" / "demo-distil-self.tar.xz"


def novel_requests(n: int) -> list[str]:
    """n self-instruct function requests, one a task (its first phrasing), no held-out name, in a seeded order."""
    with tarfile.open(SELF_SET) as tar:
        rows = [json.loads(line) for line in tar.extractfile("self/prompts.jsonl").read().decode().splitlines()]
    seen, out = set(), []
    for r in rows:
        if r["kind"] == "function" and r["name"] not in seen and not any(h in r["user"] for h in HELDOUT_NAMES):
            seen.add(r["name"])
            out.append(r["user"])
    random.Random(0).shuffle(out)
    return out[:n]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--target", type=Path, default=DEMO_DIR / "target", help="whose tokenizer (default: the shipped)")
    ap.add_argument("-n", type=int, default=20)
    a = ap.parse_args(argv)
    if not SELF_SET.is_file():
        sys.exit(f"kind_prompts: {SELF_SET} is missing: run it from a checkout of the repository")
    if not (a.target / "tokenizer.json").is_file():
        sys.exit(f"kind_prompts: no tokenizer.json in {a.target}")
    enc = Encoder(a.target)
    heldout = [x["user"] for x in json.loads((DEMO_DIR / "heldout_prompts.json").read_text())[: a.n]]
    sets = {"heldout": heldout, "known": everyday_requests(7, set())[: a.n], "novel": novel_requests(a.n)}
    a.out.mkdir(parents=True, exist_ok=True)
    for name, users in sets.items():
        rows = [{"user": u, "prompt_ids": ids} for u, ids in zip(users, enc.requests(users))]
        (a.out / f"{name}.json").write_text(json.dumps(rows))
        print(f"{a.out / name}.json: {len(rows)} requests")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
