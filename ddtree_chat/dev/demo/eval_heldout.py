"""The issue-31 quality figures: a model pair answers the 20 held-out function requests (prompts.HELDOUT) at
T=0 through the engine, as the chat would; the replies are scored (define the function, pass its tests,
fenced Markdown) and a few are printed verbatim.

    python -m ddtree_chat.dev.demo.eval_heldout                          # the shipped demo pair
    python -m ddtree_chat.dev.demo.eval_heldout --target DIR/target --draft DIR/draft --json out.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from .copy_probe import heldout_prompts
from .prompts import HELDOUT, evaluate


def repeated_share(text: str, n: int = 4) -> float:
    """The share of a reply's word n-grams that occurred earlier in it (0: no loop; a reply stuck in one: near 1)."""
    words = text.split()
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, default=None)
    ap.add_argument("--draft", type=Path, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--mode", default="ddtree", choices=["ddtree", "dflash", "ar"])
    ap.add_argument("--max-new", type=int, default=384)
    ap.add_argument("--repeat-penalty", type=float, default=1.0, help="the chat's --repeat-penalty (1: off)")
    ap.add_argument("-n", type=int, default=len(HELDOUT), help="the first n requests only")
    ap.add_argument("--show", type=int, default=3, help="replies printed verbatim")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)

    from ddtree_chat.engine import Engine, GenerationConfig
    from ddtree_chat.engine.default_model import resolve_model_dirs

    target, draft = resolve_model_dirs(a.target, a.draft)
    eng = Engine.load(target, draft, device=a.device)
    items = HELDOUT[: a.n]
    replies, tokens, t0 = [], 0, time.time()
    for ids in heldout_prompts(eng.tokenizer)[: a.n]:
        done = None
        cfg = GenerationConfig(mode=a.mode, temperature=0.0, max_new_tokens=a.max_new, repeat_penalty=a.repeat_penalty)
        for ev in eng.generate(ids, cfg):
            done = ev
        replies.append(done["text"])
        tokens += len(done["token_ids"])
    dt = time.time() - t0
    res = evaluate(replies, items)
    res["repeated_4grams"] = sum(map(repeated_share, replies)) / len(replies)
    for h, r in list(zip(items, replies))[: a.show]:
        print(f"--- {h.prompt}\n{r}\n")
    print(f"{target}: {res['defines']}/{res['n']} define the requested function, {res['passes']}/{res['n']} pass "
          f"its tests, {res['fenced']}/{res['n']} fenced, {res['def_line']}/{res['n']} with a def line, "
          f"repeated 4-grams {res['repeated_4grams']:.2f} ({tokens} tokens in {dt:.1f}s, {a.mode}, T=0, "
          f"repeat penalty {a.repeat_penalty:g})")
    if a.json:
        a.json.write_text(json.dumps({"target": str(target), "draft": str(draft), "mode": a.mode, "repeat_penalty": a.repeat_penalty,
                                      "torch": torch.__version__, "eval": res,
                                      "replies": dict(zip((h.name for h in items), replies))}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
