"""All-reduce latency by message size, the engine's one-shot collectives against NCCL, on this machine's GPUs:
the crossover above which NCCL wins, measured (the engine's default serves every size one-shot, for row
invariance; this is the figure a non-exact mode or the multi-GPU projection needs).

    PYTHONPATH=. python benchmarks/allreduce.py --world 8 [--json OUT]        # N GPUs, N processes
    python benchmarks/allreduce.py --world 2 --device cpu                       # CPU smoke run (gloo only)

Each rank joins the group as the engine does (parallel.group.init_group: NCCL plus the one-shot buffers when
every GPU pair has peer access). Per size, 20 all-reduces of a bf16 message are recorded in one CUDA graph
and replayed; rank 0 reports the median per call over 5 replays. With DDTREE_TP_ONE_GPU=1 every rank shares
GPU 0 (no NCCL; the one-shot figures then measure time-slicing, not the collective)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES = [4 << 10, 14 << 10, 56 << 10, 128 << 10, 256 << 10, 1 << 20, 4 << 20]  # bytes (14 KB: one K2.6 row)
CALLS, REPS = 20, 5


def _per_call_us(fn, cuda: bool) -> float:
    """Median per-call time of CALLS calls of fn: one recorded graph replayed REPS times on a GPU, else timed."""
    if not cuda:
        times = []
        for _ in range(REPS):
            t0 = time.perf_counter()
            for _ in range(CALLS):
                fn()
            times.append((time.perf_counter() - t0) / CALLS * 1e6)
        return sorted(times)[REPS // 2]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # NOTE: warm-up outside the capture (compiles, NCCL's communicator)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    times = []
    for _ in range(REPS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / CALLS)
    return sorted(times)[REPS // 2]


def _rank(rank: int, world: int, port: int, device: str, sizes: list[int], results) -> None:
    import torch.distributed as dist

    from ddtree_chat.engine.parallel.group import init_group, rank_device

    try:
        tp = init_group(rank, world, port, device, False)
        dev = rank_device(device, rank)
        cuda = dev.type == "cuda"
        nccl = cuda and dist.get_backend() == "nccl"
        rows = []
        for size in sizes:
            x = torch.randn(size // 2, device=dev).to(torch.bfloat16)
            row = {"bytes": size}
            if tp.oneshot is not None:
                row["oneshot_us"] = _per_call_us(lambda: tp.oneshot.all_reduce(x), cuda)
            if nccl or not cuda:  # NOTE: on the CPU the group's own backend (gloo) is the baseline
                row["nccl_us" if nccl else "gloo_us"] = _per_call_us(lambda: dist.all_reduce(x), cuda)
            rows.append(row)
        if tp.oneshot is not None:
            tp.close()
        dist.barrier(group=tp.host)
        dist.destroy_process_group()
        results.put((rank, rows))
    except BaseException as e:  # noqa: BLE001 - reported by rank 0's parent
        results.put((rank, f"{type(e).__name__}: {e}"))


def crossover(rows: list[dict]) -> int | None:
    """The smallest size from which NCCL is at least as fast as the one-shot at every larger size too."""
    both = [r for r in rows if "oneshot_us" in r and "nccl_us" in r]
    for i, r in enumerate(both):
        if all(s["nccl_us"] <= s["oneshot_us"] for s in both[i:]):
            return r["bytes"]
    return None


def main(argv=None) -> int:
    import torch.multiprocessing as mp

    from ddtree_chat.engine.parallel.workers import _free_port

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=max(2, torch.cuda.device_count()))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--sizes", type=int, nargs="+", default=SIZES, help="message sizes in bytes")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    ctx = mp.get_context("spawn")
    results, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_rank, args=(r, a.world, port, a.device, a.sizes, results)) for r in range(a.world)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=600) for _ in range(a.world))
    for p in procs:
        p.join(30)
    failed = {r: v for r, v in got.items() if isinstance(v, str)}
    if failed:
        print(f"allreduce: a rank failed: {failed}", file=sys.stderr)
        return 1
    rows = got[0]
    print(f"all-reduce, {a.world} ranks, {a.device}, bf16, per call (median of {REPS} replays of {CALLS} calls):")
    keys = [k for k in ("oneshot_us", "nccl_us", "gloo_us") if k in rows[0]]
    print("| bytes | " + " | ".join(keys) + " |")
    for r in rows:
        print(f"| {r['bytes']} | " + " | ".join(f"{r[k]:.1f}" for k in keys) + " |")
    cross = crossover(rows)
    print(f"NCCL at least as fast from {cross} bytes" if cross else "no crossover measured (NCCL absent or never faster)")
    if a.json:
        a.json.write_text(json.dumps({"world": a.world, "device": a.device, "rows": rows, "crossover_bytes": cross},
                                     indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
