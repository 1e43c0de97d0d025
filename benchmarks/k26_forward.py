"""K2.6-shaped target forward on one GPU: real dimensions, random weights made on the device (INT4 experts
in the checkpoint layout, repacked by the kernel hook), a few layers; per-forward time for 1 / 16 / 64
tree tokens over a committed context, against the bytes it must read and the copy ceiling measured in the
same process (eager SM copy, CUDA events).

    PYTHONPATH=. python benchmarks/k26_forward.py --synthetic-layers 4 --context 8192 --tokens 1 16 64 [--json OUT]
    PYTHONPATH=. python benchmarks/k26_forward.py --synthetic-layers 2 --layer 1 ...   # one MoE layer alone
    python benchmarks/k26_forward.py --tiny --device cpu                                # CPU smoke run
    PYTHONPATH=. python benchmarks/k26_forward.py --synthetic-layers 61 --tp-world 8 --collective-us 10 ...
    PYTHONPATH=. python benchmarks/k26_forward.py ... --pdl 0 1 0 1     # DDTREE_PDL off / on, row by row

With --tp-world N it builds rank 0's shard of an N-way tensor-parallel target (its heads, 1/N of the
vocabulary and of every split matrix, 1/N of each expert's intermediate) and replaces each collective by a
timed stand-in: a GPU sleep of --collective-us microseconds (calibrated in the same process) where an
all-reduce would run, a local copy of the gathered size for the vocab-parallel logits.

Times are eager (as the engine runs today) and, when capture works, one CUDA-graph replay of the same
forward. Bytes: ddtree_chat.engine.memory.forward_bytes (distinct experts touched under uniform
routing); with --layer, one decoder layer (attention + MLP + norms) on random hidden states
against memory.layer_bytes."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from unittest.mock import patch

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from k26_round import TINY_TARGET  # noqa: E402
from kernels import copy_ceiling, events_ms  # noqa: E402
from stand_in import stand_in_group  # noqa: E402

from ddtree_chat import knobs  # noqa: E402
from ddtree_chat.engine.kv_cache import KVCache  # noqa: E402
from ddtree_chat.engine.memory import forward_bytes, layer_bytes, weight_bytes  # noqa: E402
from ddtree_chat.engine.ops.registry import Op  # noqa: E402
from ddtree_chat.engine.random_model import k26_config, random_target  # noqa: E402
from ddtree_chat.engine.tree import build_tree  # noqa: E402


def _tree(t: int, depth: int, gen: torch.Generator, dev):
    if t == 1:
        return torch.ones(1, 1, dtype=torch.bool, device=dev), torch.zeros(1, dtype=torch.long, device=dev)
    k = max(2, -(-t // depth))
    lp = torch.log_softmax(torch.randn(depth, k, generator=gen), -1).sort(-1, descending=True).values
    tree = build_tree(0, lp.to(dev), torch.zeros(depth, k, dtype=torch.long, device=dev), t - 1)
    return tree.mask(), tree.depth


QUEUED = 10  # replays launched back to back for the queued figure


def _host_ms(fn, iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters * 1e3


def _measure(model, cfg, cache, t: int, ctx: int, a, gen, dev, dtype, ceiling) -> dict:
    """One forward over t tree tokens after ctx committed ones: eager and (GPU) graph-replay times vs the bytes."""
    cuda = dev.type == "cuda"
    mask, depth = _tree(t, 7, gen, dev)
    toks = torch.randint(0, cfg.vocab_size, (t,), generator=gen).to(dev)
    pos = depth + ctx
    if a.layer is None:
        def fwd():
            return model.logits(model(toks, pos, mask, cache)[0])
    else:
        x = torch.randn(t, cfg.hidden_size, generator=gen).to(dev, dtype)
        cos, sin = model.rope(pos, dtype)
        layer = model.layers[a.layer]

        def fwd():
            return layer(x, cos, sin, mask, cache)

    with torch.no_grad():
        for _ in range(2):
            fwd()
        eager_ms = events_ms(fwd, 5) if cuda else _host_ms(fwd, 3)
        graph_ms = queued_ms = None
        try:
            if cuda:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    fwd()
                graph_ms = events_ms(g.replay, 5)
                # NOTE: replays launched back to back (as rounds that run ahead are): each launch's latency overlaps
                # the previous replay, which the one-at-a-time figure pays in full
                queued_ms = events_ms(lambda: [g.replay() for _ in range(QUEUED)], 3) / QUEUED
        except Exception as e:  # report, keep the eager figure
            print(f"T={t}: CUDA-graph capture failed ({type(e).__name__}: {str(e)[:120]})")
    need = forward_bytes(cfg, t, ctx, a.tp_world)
    nbytes = need["total"] if a.layer is None else layer_bytes(cfg, a.layer, t, ctx)
    bound_ms = nbytes / ceiling * 1e3 if ceiling else None
    best = graph_ms or eager_ms
    return {"context": ctx, "tokens": t, "eager_ms": eager_ms, "graph_ms": graph_ms, "queued_ms": queued_ms,
            "bound_ms": bound_ms,
            "bytes": nbytes, "experts_touched": need["experts_touched_per_layer"],
            "ratio_to_bound": best / bound_ms if bound_ms else None}


@contextlib.contextmanager
def ops_labelled():
    """Each registry Op call as a profiler range named by the op and its tensor arguments' shapes, so a
    profile attributes kernel time to the op and shape that launched it (a kernel name alone, e.g. one
    product kernel for every shape, does not say which)."""
    run = Op.run

    def labelled(self, ref, x, args):
        shapes = " ".join("x".join(map(str, a.shape)) for a in args if torch.is_tensor(a))
        with torch.profiler.record_function(f"op {self.name} {shapes}"):
            return run(self, ref, x, args)

    Op.run = labelled
    try:
        yield
    finally:
        Op.run = run


def build_target(cfg, dev, dtype, tp):
    """The random K2.6-shaped target as the engine runs it: q_a and kv_a as one product (the Decoder fuses them)."""
    model = random_target(cfg, dev, dtype, tp=tp)
    model.fuse_projections()
    return model


def gpu_work(events) -> list[tuple[float, float]]:
    """(start, end) of every kernel and copy on the GPU timeline (not the op ranges), in start order."""
    return sorted((e.time_range.start, e.time_range.end) for e in events
                  if e.device_type != torch.autograd.DeviceType.CPU and not e.name.startswith("op "))


def op_rows(events) -> list[tuple[str, int, float]]:
    """(op and shapes, calls, GPU us in all) from a profile's events taken under ops_labelled, most time first.
    An op call's GPU time is the kernels' (and copies') own time inside its range on the GPU timeline, not the
    range's span: an eager forward leaves the GPU idle between launches, and the span counts that idle too."""
    ranges = [e for e in events if e.name.startswith("op ")]
    work = gpu_work(events)
    rows: dict[str, list] = {}
    for e in ranges:
        row = rows.setdefault(e.name, [0, 0.0])
        if e.device_type == torch.autograd.DeviceType.CPU:
            row[0] += 1  # NOTE: one CPU range per call; its GPU range exists only when it launched something
        else:
            a, b = e.time_range.start, e.time_range.end
            row[1] += sum(end - start for start, end in work if start >= a and end <= b)
    return sorted(((key, calls, us) for key, (calls, us) in rows.items()), key=lambda r: (-r[2], r[0]))


def _profile(model, cfg, cache, t: int, ctx: int, gen, dev) -> None:
    """GPU time of one eager forward (a graph replays the same kernels) by kernel, top 20, and by op and
    shape."""
    mask, depth = _tree(t, 7, gen, dev)
    toks = torch.randint(0, cfg.vocab_size, (t,), generator=gen).to(dev)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.no_grad(), ops_labelled():
        model.logits(model(toks, depth + ctx, mask, cache)[0])
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=activities) as prof:
            model.logits(model(toks, depth + ctx, mask, cache)[0])
            torch.cuda.synchronize()
    print(f"GPU time by kernel, one forward over {t} tokens after {ctx}:")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=20, max_name_column_width=60))
    # NOTE: a graph replays these one after another: each launch adds a gap however short the kernel
    work = gpu_work(prof.events())
    print(f"GPU work items (kernels and copies) in the forward: {len(work)}, {sum(b - a for a, b in work):.1f} us")
    print("GPU time by op and argument shapes (us in all, calls; an op served by its reference of other ops "
          "counts them too), the same forward:")
    for key, calls, us in op_rows(prof.events()):
        print(f"{us:9.1f} {calls:4d}  {key}")
    _profile_replay(model, toks, depth + ctx, mask, cache)


def replay_gaps(kernels: list[tuple[float, float, str]]) -> dict:
    """From one graph replay's GPU work, (start, end, name) in start order: its span, the work's own time, and
    the idle time before each item summed by that item's name (what a replay adds to the kernels' time)."""
    gaps: dict[str, list] = {}
    for (_, end, _), (start, _, name) in zip(kernels, kernels[1:]):
        row = gaps.setdefault(name, [0, 0.0])
        row[0] += 1
        row[1] += max(0.0, start - end)
    return {"span_us": kernels[-1][1] - kernels[0][0] if kernels else 0.0,
            "work_us": sum(b - a for a, b, _ in kernels),
            "gap_by_next": sorted(((n, c, us) for n, (c, us) in gaps.items()), key=lambda r: -r[2])}


def _profile_replay(model, toks, pos, mask, cache) -> None:
    """The same forward captured as a CUDA graph and profiled over one replay: where the replay's time goes
    beyond its kernels' own (the idle between one node's end and the next one's start)."""
    g = torch.cuda.CUDAGraph()
    with torch.no_grad():
        with torch.cuda.graph(g):
            model.logits(model(toks, pos, mask, cache)[0])
    g.replay()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                     if e.device_type != torch.autograd.DeviceType.CPU)
    r = replay_gaps(kernels)
    timed = [events_ms(g.replay, 20) * 1e3 for _ in range(3)]  # NOTE: the table's timing, thrice, after all rows
    print(f"One graph replay under the profiler: {len(kernels)} work items, span {r['span_us']:.1f} us, "
          f"their own time {r['work_us']:.1f} us, idle between them {r['span_us'] - r['work_us']:.1f} us; "
          f"the same graph event-timed (median of 20, three times): {', '.join(f'{us:.1f}' for us in timed)} us; "
          "idle before each kind of item (us in all, count, name):")
    for name, count, us in r["gap_by_next"][:15]:
        print(f"{us:9.1f} {count:4d}  {name[:100]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--synthetic-layers", type=int, default=4)
    ap.add_argument("--context", type=int, nargs="+", default=[8192], help="committed context(s), one row set each")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--layer", type=int, default=None, help="time this decoder layer alone")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="scaled-down dimensions (CPU smoke run)")
    ap.add_argument("--tp-world", type=int, default=1, help="time rank 0's shard of this many TP ranks")
    ap.add_argument("--collective-us", type=float, nargs="+", default=[0.0],
                    help="the stand-in all-reduce's time(s) under --tp-world, one row set each")
    ap.add_argument("--profile", type=int, nargs="+", default=[], help="also print where a forward over this many "
                    "tokens spends its GPU time (kernels by total time, first context), one profile each")
    ap.add_argument("--pdl", nargs="+", choices=["0", "1"], default=None,
                    help="time each row under these DDTREE_PDL settings in turn, side by side in this process "
                         "(default: the environment's)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    ceiling = copy_ceiling() if cuda else None
    cfg = k26_config(layers=a.synthetic_layers, **(TINY_TARGET if a.tiny else {}))
    tp, stand_in = stand_in_group(a.tp_world)
    t_load = time.perf_counter()
    model = build_target(cfg, dev, dtype, tp)
    if cuda:
        torch.cuda.synchronize()
    t_load = time.perf_counter() - t_load
    rank_gb = torch.cuda.memory_allocated(dev) / 1e9 if cuda else None
    cache = KVCache(cfg.num_layers, max(a.context) + max(a.tokens) + 1, cfg.kv_lora_rank, cfg.qk_rope_head_dim,
                    dtype, dev)
    cache.ckv.normal_()
    cache.kpe.normal_()
    gen = torch.Generator().manual_seed(0)
    rows = []
    for ctx in a.context:
        cache.length = ctx  # a committed context of random latents; forwards write after it, never commit
        for t in a.tokens:
            for us in (a.collective_us if a.tp_world > 1 else [0.0]):
                stand_in.set_us(us)
                for pdl in a.pdl or [None]:
                    # NOTE: the knob is read at every launch: the row's graph is recorded under its setting
                    with patch.dict(os.environ, {knobs.PDL.name: pdl} if pdl else {}):
                        rows.append(dict(_measure(model, cfg, cache, t, ctx, a, gen, dev, dtype, ceiling),
                                         collective_us=us, pdl=knobs.get(knobs.PDL)))
    for t in a.profile if cuda else []:
        cache.length = a.context[0]
        stand_in.set_us(0.0)
        _profile(model, cfg, cache, t, a.context[0], gen, dev)
    what = f"layer {a.layer} of {cfg.num_layers}" if a.layer is not None else f"{cfg.num_layers} layers"
    contexts = ", ".join(map(str, a.context))
    where = f"copy ceiling {ceiling / 1e9:.0f} GB/s" if ceiling else "CPU (no bound)"
    shard = f", rank 0 of TP={a.tp_world} (all-reduces: timed stand-ins)" if a.tp_world > 1 else ""
    print(f"K2.6-shaped target, {what}{shard}, context {contexts}, {dtype}, {where}")
    if cuda:
        print(f"weights {weight_bytes(cfg, a.tp_world) / 1e9:.1f} GB per rank (planned), {rank_gb:.1f} GB allocated "
              f"after building, built in {t_load:.0f} s")
    print("| context | tokens | all-reduce us | PDL | experts/layer | bytes (GB) | bound ms | eager ms | graph ms | "
          f"graph ms, {QUEUED} queued | best / bound |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        gm = f"{r['graph_ms']:.2f} | {r['queued_ms']:.2f}" if r["graph_ms"] else "- | -"
        bound = f"{r['bound_ms']:.2f} | " if r["bound_ms"] else "- | "
        ratio = f"{r['ratio_to_bound']:.2f}x" if r["ratio_to_bound"] else "-"
        print(f"| {r['context']} | {r['tokens']} | {r['collective_us']:g} | {r['pdl']} | {r['experts_touched']:.0f} | "
              f"{r['bytes'] / 1e9:.3f} | {bound}"
              f"{r['eager_ms']:.2f} | {gm} | {ratio} |")
    if a.json:
        a.json.write_text(json.dumps({"layers": cfg.num_layers, "layer": a.layer, "context": a.context,
                                      "ceiling": ceiling, "tp_world": a.tp_world,
                                      "rank_gb": rank_gb, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
