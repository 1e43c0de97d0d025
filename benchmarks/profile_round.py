"""Where a reply's GPU time goes: the top CUDA kernels of one reply per mode, under torch.profiler.

    PYTHONPATH=. python benchmarks/profile_round.py [--modes ar dflash ddtree:32 ddtree:auto] [--max-new 128]
                                                    [--eager] [--ops] [--host] [--programs] [--top 12]
                                                    [--device cuda|cpu] [--json OUT] [--verify-sizes 1 2 9 17]

Defaults to the shipped demo pair and its first held-out prompt. Per mode: wall time, summed kernel time
(the GPU's busy share), rounds, and the kernels that take the most time (name, calls, total, per call).
--ops (implies --eager) lists torch ops with their input shapes instead, to tell which op a kernel is;
--host adds the Python functions that take the most host time in one more reply (cProfile; a device
wait shows up in the call that waits, e.g. tolist); --programs (graphs only) times each of the round's
recorded programs (draft / verify / accept) alone, replayed back to back, with its kernel count.
--device cpu: the same per mode without kernels (wall time, rounds), and --programs times each program run
directly (where a CPU round goes). --verify-sizes N...: after the modes, the best of 20 verifies of N nodes each
(the auto budget's cost curve, `graphs.verify_seconds`: a star of varied tokens, so the MoE touches as many
experts as a real tree), and a plain step's (one node, no drafter features): what a tree costs over an ar step."""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile


def programs(g, mode: str, budget, reps: int = 50, top_n: int = 8) -> list[dict]:
    """Each program of this mode's round, recorded (or, uncaptured, run) at the decoder's current context:
    ms per call (CUDA: `reps` back-to-back graph replays timed with CUDA events; CPU: perf_counter) and, on
    CUDA, kernels per replay and the `top_n` kernels by time in one replay (profiler). NOTE: accept writes
    only scratch rows and the device state, which is put back after each run."""
    from ddtree_chat.engine.generation import AUTO_BUDGETS

    choosing = budget == "auto"
    size = AUTO_BUDGETS[-1] if choosing else (budget if isinstance(budget, int) else 0)
    sizes = g.plan(mode, size, choosing)[1]
    keys = list(g.round_keys(mode, size, sizes, choosing))
    g.prepare(keys)
    state = g.state.clone()
    rows = []
    for key in keys:
        g.run(key)  # NOTE: uncaptured, this also leaves verify's outputs for accept
        if g.capture:
            graph = g.graphs[key][0]
            # NOTE: accept advances the device lengths; replayed from the same state each time (so it stays
            # inside the caches), its time includes that one 24-byte copy
            replay = (lambda: (g.state.copy_(state), graph.replay())) if key[0] == "accept" else graph.replay
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                replay()
            end.record()
            torch.cuda.synchronize()
            ms = start.elapsed_time(end) / reps
            g.state.copy_(state)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                graph.replay()
                torch.cuda.synchronize()
            kernels = sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA)
            top = [{"kernel": e.key[:100], "calls": e.count, "us": e.self_device_time_total}
                   for e in sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)[:top_n]]
        else:
            t0 = time.perf_counter()
            for _ in range(reps):
                g.state.copy_(state)
                g.run(key)
            ms, kernels, top = (time.perf_counter() - t0) / reps * 1e3, None, []
        rows.append({"program": str(key), "key": key, "ms": ms, "kernels": kernels, "top": top})
        print(f"| {key} | {ms:.3f} ms | {kernels if kernels is not None else '-'} kernels |")
        for t in top:  # NOTE: one replay under the profiler, whose kernel times run a little long
            print(f"|   {t['kernel']} | {t['calls']} calls | {t['us']:.1f} us |")
    g.state.copy_(state)
    return rows


def verify_costs(g, sizes: list[int], repeats: int = 20) -> dict[str, float]:
    """ms of the best of `repeats` verifies per node count (the graphs' verify_seconds), and "plain": an ar step's."""
    ms = {"plain": g.verify_seconds(1, torch.zeros(1, dtype=torch.long, device=g.dec.device), repeats, False) * 1e3}
    for n in sizes:
        toks = torch.randint(0, g.dec.tcfg.vocab_size, (n,), generator=torch.Generator().manual_seed(n))
        ms[str(n)] = g.verify_seconds(n, toks.to(g.dec.device), repeats) * 1e3
    print("\n| verify nodes | ms | / plain step |\n|---|---:|---:|")
    for k, v in ms.items():
        print(f"| {k} | {v:.3f} | {v / ms['plain']:.2f}x |")
    return ms


def main(argv=None) -> int:
    from ddtree_chat.dev.demo.common import heldout_prompts
    from ddtree_chat.engine import Engine, GenerationConfig
    from ddtree_chat.engine.default_model import shipped_demo_dirs

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", nargs="+", default=["ar", "dflash", "ddtree:32", "ddtree:auto"])
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--ops", action="store_true")
    ap.add_argument("--host", action="store_true")
    ap.add_argument("--programs", action="store_true")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--verify-sizes", type=int, nargs="*", default=[])
    a = ap.parse_args(argv)
    eng = Engine.load(*shipped_demo_dirs(), device=a.device, graphs=not (a.eager or a.ops))
    cuda = eng.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    acts = ([ProfilerActivity.CUDA] if cuda else []) + ([ProfilerActivity.CPU] if a.ops else [])
    ids = heldout_prompts(1)[0]["prompt_ids"]
    out = {}
    for spec in a.modes:
        mode, _, b = spec.partition(":")
        cfg = GenerationConfig(mode=mode, budget=(b if b == "auto" else int(b)) if b else 32, max_new_tokens=a.max_new)
        for _ in eng.generate(ids, cfg):  # warm-up
            pass
        sync()
        # NOTE: on the CPU (no --ops) nothing to profile: the wall time alone, without the profiler's overhead
        with profile(activities=acts, record_shapes=a.ops) if cuda or a.ops else contextlib.nullcontext() as prof:
            t0 = time.perf_counter()
            done = list(eng.generate(ids, cfg))[-1]
            sync()
            wall = time.perf_counter() - t0
        rows = sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total) if prof else []
        busy = sum(e.self_device_time_total for e in rows) / 1e6
        # NOTE: --ops: aten ops by input shapes, by their kernels' time (CUDA) or their own host time (CPU)
        op_us = (lambda e: e.device_time_total) if cuda else (lambda e: e.self_cpu_time_total)  # noqa: E731
        us = op_us if a.ops else (lambda e: e.self_device_time_total)  # noqa: E731
        if a.ops:
            rows = sorted((e for e in prof.key_averages(group_by_input_shape=True) if e.key.startswith("aten::")),
                          key=lambda e: -op_us(e))
        top = [{"kernel": (e.key + (f" {e.input_shapes}" if a.ops else ""))[:160], "calls": e.count,
                "total_ms": us(e) / 1e3, "us_per_call": us(e) / max(e.count, 1)} for e in rows[: a.top]]
        out[spec] = {"wall_s": wall, "busy_s": busy, "rounds": done["rounds"], "tokens": len(done["token_ids"]),
                     "top": top}
        print(f"\n## {spec}: {len(done['token_ids'])} tokens, {done['rounds']} rounds, wall {wall * 1e3:.1f} ms, "
              + (f"kernels {busy * 1e3:.1f} ms ({100 * busy / wall:.0f}% busy), " if cuda else "")
              + f"{wall / max(done['rounds'], 1) * 1e3:.3f} ms/round")
        if cuda or a.ops:  # NOTE: a CPU profile holds no kernels, only --ops' aten calls
            print(f"| {'kernel' if cuda else 'aten op (input shapes)'} | calls | total ms | us/call |\n|---|---|---|---|")
            for t in top:
                print(f"| {t['kernel']} | {t['calls']} | {t['total_ms']:.2f} | {t['us_per_call']:.1f} |")
        if a.programs:
            out[spec]["programs"] = programs(eng.decoder.graphs, mode, cfg.budget, top_n=a.top)
        if a.host:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.enable()
            list(eng.generate(ids, cfg))
            sync()
            prof.disable()
            print(f"\n### host time, {spec}")
            pstats.Stats(prof).sort_stats("tottime").print_stats(a.top)
    if a.verify_sizes:
        out["verify_ms"] = verify_costs(eng.decoder.graphs, a.verify_sizes)
    from ddtree_chat.engine.ops import triton_mla

    out["mla_configs"] = triton_mla.tuned_configs()
    print("\nMLA autotune choices (rows, splits, span, ...): config")
    for key, cfg in out["mla_configs"].items():
        print(f"  {key}: {cfg}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
