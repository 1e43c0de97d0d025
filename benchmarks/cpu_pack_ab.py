"""A CPU form on and off, in one process, alternated prompt by prompt, so a busy or drifting machine weighs on both
alike: for each mode, tokens/s with each, and its speedup over ar with each (every ratio of times measured on the
same prompts in the same process). --what pack (default): packed CPU products (ops/cpu_packed.py) against
F.linear; --what onednn: large float32 weights packed for oneDNN (cpu_packed.ONEDNN_MIN) against every float32
weight packed for MKL; --what moe: the routed experts run densely from ops/moe.py's DENSE_ROWS rows on against
the grouped products at every row count; --what sdpa: the drafter's attention as one fused call
(ops/cpu_draft_attention.py) against the einsum reference.

    PYTHONPATH=. python benchmarks/cpu_pack_ab.py [--what pack|onednn|moe|sdpa] [--prompts 20] [--max-new 128]
                                                  [--modes ar dflash ddtree:8 ddtree:16]

The shipped pair and its held-out prompts, T=0, one intra-op thread. F.linear is what DDTREE_CPU_PACK=0 runs:
here the packed forms are switched off and on between replies by clearing and restoring the weights' flags.
Every reply's ids must equal ar's under the same setting."""

from __future__ import annotations

import argparse
import time

import torch


def main(argv=None) -> int:
    from ddtree_chat.dev.demo.common import heldout_prompts
    from ddtree_chat.engine import Engine, GenerationConfig
    from ddtree_chat.engine.default_model import shipped_demo_dirs
    from ddtree_chat.engine.ops import cpu_draft_attention, cpu_packed, moe

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--modes", nargs="+", default=["ar", "dflash", "ddtree:8", "ddtree:16"])
    ap.add_argument("--what", choices=["pack", "onednn", "moe", "sdpa"], default="pack")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    eng = Engine.load(*shipped_demo_dirs(), device="cpu")
    weights = [t for m in (eng.target, eng.drafter) for t in list(m.parameters()) + list(m.buffers())
               if cpu_packed.packable(t)] + [t for t in [eng.decoder.draft_head] if t is not None and cpu_packed.packable(t)]
    assert weights or a.what in ("sdpa", "moe"), "nothing packed: DDTREE_CPU_PACK=0 or no packed product in this torch build"

    limit, dense_rows = cpu_packed.ONEDNN_MIN, moe.DENSE_ROWS

    def setting(on: bool) -> None:
        if a.what == "sdpa":
            cpu_draft_attention.ENABLED = on
            return
        if a.what == "moe":
            moe.DENSE_ROWS = dense_rows if on else float("inf")
            return
        repack = a.what == "onednn"  # NOTE: both settings pack, each for its BLAS: drop the other's forms
        if repack:
            cpu_packed.ONEDNN_MIN = limit if on else float("inf")
        for t in weights:
            setattr(t, cpu_packed.FLAG, on or repack)
            if (repack or not on) and hasattr(t, cpu_packed.PACKED):
                delattr(t, cpu_packed.PACKED)  # NOTE: repacked on first use (a few ms a reply, both sides warm)

    def cfg(spec: str) -> GenerationConfig:
        mode, _, b = spec.partition(":")
        return GenerationConfig(mode=mode, budget=int(b) if b else 32, max_new_tokens=a.max_new)

    prompts = [p["prompt_ids"] for p in heldout_prompts(a.prompts)]
    for on in (True, False):  # warm-up: each setting's products and rounds once
        setting(on)
        for spec in a.modes:
            list(eng.generate(prompts[0], cfg(spec)))
    secs = {(on, s): 0.0 for on in (True, False) for s in a.modes}
    toks = dict.fromkeys(secs, 0)
    for i, ids in enumerate(prompts):
        for on in ((True, False) if i % 2 == 0 else (False, True)):
            setting(on)
            ar_ids = None
            for spec in a.modes:
                # NOTE: a one-token reply to another prompt first, so no reply reuses the last one's cache
                list(eng.generate([(ids[0] + 1) % eng.tcfg.vocab_size], GenerationConfig(mode="ar", max_new_tokens=1)))
                t0 = time.perf_counter()
                done = list(eng.generate(ids, cfg(spec)))[-1]
                secs[on, spec] += time.perf_counter() - t0
                toks[on, spec] += len(done["token_ids"])
                ar_ids = done["token_ids"] if spec == "ar" else ar_ids
                assert ar_ids is None or done["token_ids"] == ar_ids, (i, spec, on)
    setting(True)
    print(f"{len(prompts)} held-out prompts, {a.max_new} new tokens, T=0, CPU float32 target, one thread; "
          "ids == ar in every mode under both")
    on_name, off_name = {"pack": ("packed", "F.linear"), "onednn": ("oneDNN", "MKL"), "moe": ("dense", "grouped"),
                          "sdpa": ("fused", "einsum")}[a.what]
    print(f"| mode | {on_name} tok/s | {off_name} tok/s | {on_name} / {off_name} | vs ar, {on_name} | vs ar, {off_name} |")
    print("|---|---:|---:|---:|---:|---:|")
    for spec in a.modes:
        rate = {on: toks[on, spec] / secs[on, spec] for on in (True, False)}
        ar = {on: toks[on, "ar"] / secs[on, "ar"] for on in (True, False)} if "ar" in a.modes else None
        vs = [f"{rate[on] / ar[on]:.2f}x" if ar else "-" for on in (True, False)]
        print(f"| {spec} | {rate[True]:.1f} | {rate[False]:.1f} | {rate[True] / rate[False]:.2f}x | {vs[0]} | {vs[1]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
