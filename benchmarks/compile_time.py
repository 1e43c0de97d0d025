"""Triton compile time of the kernels a first GPU start of the demo pair builds (float32), without a GPU:
triton.compile for an explicit target with Triton's bundled ptxas, one compile per constexpr set the
engine uses (tree build per auto candidate budget, each small-M product tile height with and without
the GLU epilogue, every MLA autotune config, rope, drafter attention, ancestor mask, walk). A lower bound on the first
start's compile work: one argument specialisation each (the engine may meet a few per kernel).
--workers N compiles them N at a time (--pool process or thread) and reports the wall time: what a
parallel first start could gain on this machine. --cuda times the other first-start build instead: the CUDA
library (ddtree_chat/csrc, the engine's own nvcc command), each source alone, all at once, and all with
every MoE variant (the benchmark sweep's build). --gil compiles them one at a time while a second thread samples
who holds the GIL: compile threads can never finish faster than the held share of the serial time, whatever
the core count (compile processes can).

    python benchmarks/compile_time.py [--arch 90] [--workers N --pool process|thread | --gil] [--json OUT]
    python benchmarks/compile_time.py --cuda
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def jobs(block: int = 8, r: int = 64, p: int = 16):
    """(name, kernel, signature, constexprs) for the demo pair's first start."""
    import torch
    import triton

    from ddtree_chat.engine.generation import AUTO_BUDGETS
    from ddtree_chat.engine.ops import (triton_draft_attention, triton_latent, triton_linear, triton_mla, triton_rope,
                                        triton_topk, triton_tree)
    from test_triton_compile import (DRAFT_ATTN_SIGNATURE, LATENT_SIGNATURE, MASK_SIGNATURE, MLA_SIGNATURE, MM_SIGNATURE,
                                     ROPE_SIGNATURE, TOPK_CHUNK_SIGNATURE, TOPK_MERGE_SIGNATURE, TREE_SIGNATURE,
                                     WALK_SIGNATURE)

    for b in AUTO_BUDGETS:
        d = min(block - 1, b)
        c = triton_tree._pairs(b, b, torch.device("cpu"))[0].numel()
        bp = max(16, triton.next_power_of_2(b))
        yield f"tree b={b}", triton_tree._tree_kernel, TREE_SIGNATURE, {"D": d, "C": c, "BP": bp,
                                                                        "G": triton.next_power_of_2(d * bp)}
    tiles = sorted({triton_linear._tile(m, n)[:3] for m in (16, 17, 33, 65) for n in (256, 8192)})
    for bm, bn, bk in tiles:
        for glu in (False, True):
            yield f"mm tile {bm}x{bn}x{bk} GLU={glu}", triton_linear._mm_nt_kernel, MM_SIGNATURE, {
                "PREC": "tf32x3", "GLU": glu, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT": 1, "NORM": False}
        yield f"mm tile {bm}x{bn}x{bk} norm", triton_linear._mm_nt_kernel, MM_SIGNATURE, {
            "PREC": "tf32x3", "GLU": False, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT": 1, "NORM": True}
    for k in (768, 1536):  # the dense MLP's and the drafter's down projections: split-K
        yield f"mm split-K K={k}", triton_linear._mm_nt_kernel, MM_SIGNATURE, {
            "PREC": "tf32x3", "GLU": False, "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64,
            "SPLIT": triton.cdiv(k, triton_linear.SPLIT_K_CHUNK), "NORM": False}
    fp32 = dict(MLA_SIGNATURE, QL="*fp32", QP="*fp32", CKV="*fp32", KPE="*fp32")
    for cfg in triton_mla._CONFIGS:
        yield f"mla {cfg.kwargs}", triton_mla._mla_split_kernel.fn, fp32, dict(
            cfg.kwargs, R=r, P=p, RC=r // 4, PREC="ieee")
    rope = dict(ROPE_SIGNATURE, X="*fp32", COS="*fp32", SIN="*fp32", O="*fp32", W="*fp32")
    for half, inter, norm in ((p // 2, True, False), (64, False, True)):  # the target's q_pe / k_pe, the drafter's q / k
        yield f"rope half={half} interleaved={inter} norm={norm}", triton_rope._rope_kernel, rope, {
            "HALF": half, "BLOCK_D": 2 * half, "INTERLEAVED": inter, "BLOCK_R": max(1, min(32, 1024 // half)), "NORM": norm}
    latent = {k: "*fp32" if v == "*bf16" else v for k, v in LATENT_SIGNATURE.items()}
    for has_slots in (True, False):  # graphs' slot indices, eager consecutive slots
        yield f"latent write slots={has_slots}", triton_latent._latent_kernel, latent, {
            "R": r, "HALF": p // 2, "BLOCK_R": triton.next_power_of_2(r), "BLOCK_H": p // 2, "HAS_SLOTS": has_slots}
    for has_mask in (True, False):
        yield f"drafter attention mask={has_mask}", triton_draft_attention._draft_attn_kernel, DRAFT_ATTN_SIGNATURE, {
            "NH": 4, "REP": 2, "D": 64, "BLOCK_M": 16, "BLOCK_N": 64, "HAS_MASK": has_mask, "PREC": "tf32x3"}
    # dflash's argmax and each budget's top-k over the demo vocabulary
    for chunk, kp, c in sorted({triton_topk.plan(8192, k) for k in (1,) + AUTO_BUDGETS}):
        yield f"topk chunk K={kp}", triton_topk._chunk_kernel, dict(TOPK_CHUNK_SIGNATURE, X="*fp32"), {
            "CHUNK": chunk, "K": kp}
        yield f"topk merge K={kp}", triton_topk._merge_kernel, TOPK_MERGE_SIGNATURE, {
            "K": kp, "CB": triton.next_power_of_2(c)}
    yield "ancestor mask", triton_tree._ancestor_kernel, MASK_SIGNATURE, {"DEPTH": block - 1, "BLOCK": triton_tree._block(257)}
    yield "walk", triton_tree._walk_kernel, WALK_SIGNATURE, {"DEPTH": block - 1, "BLOCK": triton_tree._block(257)}


@functools.cache
def _jobs() -> list:
    return list(jobs())


def compile_one(i: int, arch: int) -> float:
    """Compile job i for sm_<arch>; its seconds (a worker process rebuilds the job list once)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    _, fn, sig, cx = _jobs()[i]
    t0 = time.perf_counter()
    triton.compile(ASTSource(fn=fn, signature=sig, constexprs=cx), target=GPUTarget("cuda", arch, 32))
    return time.perf_counter() - t0


def _probe(stop, out: list, seconds: float | None = None) -> None:
    """Sleep 2 ms at a time (sleeping lets the GIL go) and note each wake-up that waited over 0.5 ms for the GIL
    back: the share of such wake-ups samples the share of time another thread held it. out[0] = that share."""
    late = n = 0
    t_end = None if seconds is None else time.perf_counter() + seconds
    while not stop.is_set() and (t_end is None or time.perf_counter() < t_end):
        t0 = time.perf_counter()
        time.sleep(0.002)
        late += time.perf_counter() - t0 > 0.0025
        n += 1
    out.append(late / max(n, 1))


def gil_held_share(arch: int) -> tuple[float, float, float]:
    """(serial compile seconds, share of them a compile held the GIL, the probe's late share alone): every job
    compiled one at a time while a thread probes."""
    import threading

    alone: list = []
    _probe(threading.Event(), alone, seconds=3.0)
    stop, out = threading.Event(), []
    probe = threading.Thread(target=_probe, args=(stop, out))
    probe.start()
    t0 = time.perf_counter()
    for i in range(len(_jobs())):
        compile_one(i, arch)
    serial = time.perf_counter() - t0
    stop.set()
    probe.join()
    return serial, out[0], alone[0]


def cuda_build() -> list[dict]:
    """Seconds of the engine's nvcc command (ops/build.py) per source, for all, for all with every MoE variant, and
    for that one target at a time (the build before the picked-variant build) (the nvcc of
    tests/test_csrc_compile.py: the system's, else the pip wheel's)."""
    from test_csrc_compile import NVCC, run_nvcc

    from ddtree_chat.engine.ops import build

    if NVCC is None:
        raise SystemExit("nvcc not found (pip install -e '.[test]' brings one, or set DDTREE_NVCC)")
    out, rows = Path(tempfile.mkdtemp()), []
    every = build.sources(), ["-DDDT_MOE_SWEEP"]
    runs = [(p.name, [p], []) for p in build.sources()] + [
        ("all", build.sources(), []), ("all, every MoE variant", *every),
        ("all, every MoE variant, one target at a time", every[0], every[1] + ["--threads", "1"])]  # the last wins
    for name, srcs, flags in runs:
        t0 = time.perf_counter()
        res = run_nvcc(build.nvcc_command(NVCC, srcs, out / "lib.so", flags))
        if res.returncode:
            raise SystemExit(f"nvcc failed on {name}: {res.stderr[-2000:]}")
        rows.append({"build": name, "seconds": time.perf_counter() - t0})
        print(f"| {name} | {rows[-1]['seconds']:.1f} |", flush=True)
    return rows


def summary(rows: list[dict]) -> list[str]:
    """Compile seconds by kernel (the first word of a job's name), and the auto candidates of 64-256 nodes
    (their tree build and top-k): where a first start's time goes."""
    groups: dict[str, float] = {}
    for r in rows:
        kernel = r["kernel"].split()[0]
        groups[kernel] = groups.get(kernel, 0.0) + r["seconds"]
    large = sum(r["seconds"] for r in rows if re.search(r"\b[bK]=(64|128|256)\b", r["kernel"]))
    total = sum(groups.values())
    return ["by kernel: " + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(groups.items(), key=lambda kv: -kv[1])),
            f"auto candidates of 64-256 nodes (tree + top-k): {large:.1f} s ({large / total:.0%})"]


def main(argv=None) -> int:
    import os

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--pool", choices=("process", "thread"), default="process")
    ap.add_argument("--cuda", action="store_true", help="time the CUDA library's build instead")
    ap.add_argument("--gil", action="store_true", help="the share of compile time the GIL is held")
    a = ap.parse_args(argv)
    if a.cuda:
        print("| CUDA library build (sm_90a + sm_120a + compute_120a PTX) | s |\n|---|---|")
        rows = cuda_build()
        if a.json:
            a.json.write_text(json.dumps({"cuda_build": rows}, indent=1))
        return 0
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()  # NOTE: cold, as a first start (workers inherit it)
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

    names = [job[0] for job in _jobs()]
    if a.gil:
        serial, held, noise = gil_held_share(a.arch)
        print(f"{len(names)} compiles one at a time (sm_{a.arch}): {serial:.1f} s, the GIL held {held:.0%} of it "
              f"({held * serial:.1f} s: the least wall time any number of compile threads can take; the probe alone "
              f"saw {noise:.0%})")
        if a.json:
            a.json.write_text(json.dumps({"arch": a.arch, "serial_s": serial, "gil_held_share": held,
                                          "probe_alone": noise}, indent=1))
        return 0
    t0 = time.perf_counter()
    if a.workers > 1:
        pool = ProcessPoolExecutor if a.pool == "process" else ThreadPoolExecutor
        with pool(a.workers) as ex:
            seconds = list(ex.map(compile_one, range(len(names)), [a.arch] * len(names)))
    else:
        seconds = [compile_one(i, a.arch) for i in range(len(names))]
    wall = time.perf_counter() - t0
    rows = [{"kernel": n, "seconds": sec} for n, sec in zip(names, seconds)]
    print("| kernel | compile s |\n|---|---|")
    for r in rows:
        print(f"| {r['kernel']} | {r['seconds']:.2f} |")
    how = f"{a.workers} {a.pool}es" if a.pool == "process" else f"{a.workers} threads"
    print(f"total {sum(seconds):.1f} s for {len(rows)} compiles, wall {wall:.1f} s (sm_{a.arch}, "
          f"{how if a.workers > 1 else 'one process'})")
    print("\n".join(summary(rows)))
    if a.json:
        a.json.write_text(json.dumps({"arch": a.arch, "workers": a.workers, "pool": a.pool, "wall_s": wall,
                                      "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
