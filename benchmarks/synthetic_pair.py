"""Acceptance and wall-clock vs ar on the tiny random synthetic pair, CPU, T=0, with the random drafter
and with an oracle drafter (tests/drafters.py: mass on the target's greedy continuation).

    python benchmarks/synthetic_pair.py [--tokens 200]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    sys.path.insert(0, str(ROOT / "tests"))
    from drafters import TargetDrafter

    from ddtree_chat.engine import Engine, GenerationConfig
    from ddtree_chat.engine.synthetic import make_synthetic_pair

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=200)
    a = ap.parse_args(argv)
    eng = Engine.load(*make_synthetic_pair(Path(tempfile.mkdtemp()) / "pair"), device="cpu")
    prompt = eng.tokenizer.encode("measure the synthetic pair")

    def run(mode, budget):
        cfg = GenerationConfig(mode=mode, budget=budget, max_new_tokens=a.tokens, stop_token_ids=())
        list(eng.generate(prompt, GenerationConfig(mode=mode, budget=budget, max_new_tokens=8, stop_token_ids=())))
        t0 = time.perf_counter()
        done = list(eng.generate(prompt, cfg))[-1]
        return done, time.perf_counter() - t0

    ar, t_ar = run("ar", 0)
    print("| drafter | mode | mean accepted length | wall ratio vs ar | target-time ratio vs ar | ids == ar |")
    print("|---|---|---|---|---|---|")
    for name, drafter in (("random", None), ("oracle", TargetDrafter(eng))):
        if drafter is not None:
            eng.decoder.block_logits = drafter
        for mode, budget in (("dflash", 7), ("ddtree", 16)):
            done, t = run(mode, budget)
            print(f"| {name} | {mode} {budget} | {done['mean_accepted_length']:.2f} | {t_ar / t:.2f}x | "
                  f"{ar['target_s'] / done['target_s']:.2f}x | {'yes' if done['token_ids'] == ar['token_ids'] else 'NO'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
