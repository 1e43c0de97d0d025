"""Prompt sets by kind of task, for `benchmarks/e2e.py --prompts-json`: how well a drafter guesses replies to
requests its target trained on, to new ones, and to the held-out requests (docs/demo-training.md, "Acceptance by
kind of task"). Each set holds n requests in the held-out requests' chat prompt, tokenised by the target's tokenizer:

- heldout.json: the first n held-out requests (assets/demo/heldout_prompts.json);
- known.json: the first n of `draft_requests.everyday_requests(7, set())`, everyday tasks the shipped targets
  trained on, in any phrasing;
- novel.json: the first n of the tasks every drafter run leaves out of its requests (draft_requests.split_probe)
  from training/demo-novel-tasks.tar.xz, in the held-out requests' phrasing: new to the shipped targets (bar the
  few that the name filter in train.py finds in their training) and to every drafter, one trained with
  `--draft-novel` included (it validates on them or, where the target knew them, never asks for them).

    python -m ddtree_chat.dev.demo.kind_prompts --out DIR [--target DIR] [-n 20]
    python benchmarks/e2e.py --device cpu --prompts 20 --budgets 16 --threads 1 --prompts-json DIR/novel.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
from pathlib import Path

from ...engine.default_model import DEMO_DIR
from .data import Encoder
from .draft_requests import everyday_requests, split_probe
from .prompts import FUNCTION_TEMPLATES, HELDOUT_NAMES, request_text
from .self_instruct import PROPOSALS, kept_tasks

ROOT = Path(__file__).resolve().parents[3]
NOVEL_SET = ROOT / "training" / "demo-novel-tasks.tar.xz"


def novel_requests(n: int) -> list[str]:
    """The first n held-out new tasks (split_probe of the set's kept proposals) without a held-out name."""
    with tarfile.open(NOVEL_SET) as tar, tempfile.TemporaryDirectory() as d:
        (Path(d) / PROPOSALS).write_bytes(tar.extractfile(f"novel-proposals/{PROPOSALS}").read())
        _, probe = split_probe(kept_tasks(Path(d)))
    users = [request_text(FUNCTION_TEMPLATES[0], *t) for t in probe]
    return [u for u in users if not any(h in u for h in HELDOUT_NAMES)][:n]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--target", type=Path, default=DEMO_DIR / "target", help="whose tokenizer (default: the shipped)")
    ap.add_argument("-n", type=int, default=20)
    a = ap.parse_args(argv)
    if not NOVEL_SET.is_file():
        sys.exit(f"kind_prompts: {NOVEL_SET} is missing: run it from a checkout of the repository")
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
