"""Kernel benchmark at K2.6 shapes: time and achieved fraction of the device's own copy ceiling.

  PYTHONPATH=. python benchmarks/kernels.py --json out.json [--quick]

Ceiling: an eager SM-driven copy_ of 2 GiB -> 2 GiB timed with CUDA events (bytes read + written).
Each kernel is timed as CUDA-graph replays of N back-to-back calls (launch gaps shrunk, as in the engine),
median of several replays; fraction = bytes that must be read (and written) / time / ceiling. For the MoE
only the distinct experts touched count. The plain-torch references are timed in the same run."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

sys.path.insert(0, ".")
from ddtree_chat.engine.ops import build  # noqa: E402
from ddtree_chat.engine.ops.int4 import Int4Weight  # noqa: E402
from ddtree_chat.engine.ops.moe import ExpertWeights, moe_experts_ref  # noqa: E402

BF16_TFLOPS = 790e12  # measured bf16 matrix rate on this H200 (device README); used only for the FLOP floor


def events_ms(fn, iters):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def copy_ceiling():
    n = 1 << 30  # 1 Gi bf16 = 2 GiB
    src = torch.randn(n // 2, device="cuda").to(torch.bfloat16).repeat(2)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    ms = events_ms(lambda: dst.copy_(src), 20)
    del src, dst
    return 2 * 2 * n / (ms * 1e-3)


def graph_us(fn, inner=20, reps=7):
    """Per-call time from CUDA-graph replays of `inner` calls (warm: the autotuner's own timing)."""
    from ddtree_chat.engine.ops.triton_mla import graph_ms

    return 1e3 * graph_ms(fn, calls=inner, reps=reps)


def eager_us(fn, iters=5):
    fn()
    torch.cuda.synchronize()
    return events_ms(fn, iters) * 1e3


def rel_err(y, exact):
    """|y - exact| / |exact| (Frobenius), exact in float64."""
    return float((y.double() - exact).norm() / exact.norm())


def kernel_us(fn, calls=10):
    """Mean device time per call of each kernel fn launches (torch.profiler, eager calls after a warm-up)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return {e.key: e.self_device_time_total / calls for e in prof.key_averages() if e.self_device_time_total > 0}


def row(kind, shape, us, nbytes, ceiling, ref_us=None, flops=None, extra=None):
    r = {"kernel": kind, "shape": shape, "us": us, "bytes": nbytes, "GBps": nbytes / (us * 1e-6) / 1e9,
         "frac_ceiling": nbytes / (us * 1e-6) / ceiling}
    if flops:
        r["floor_us"] = max(nbytes / ceiling, flops / BF16_TFLOPS) * 1e6
        r["frac_floor"] = r["floor_us"] / us
    if ref_us is not None:
        r["torch_us"] = ref_us
        r["speedup_vs_torch"] = ref_us / us
    if extra:
        r.update(extra)
    return r


MOE_E, MOE_H, MOE_I, MOE_K = 384, 7168, 2048, 8  # K2.6's routed experts: count, hidden, intermediate, top-k


def k26_experts(gen, inter=MOE_I):
    """K2.6's routed experts (or a TP rank's slice of each one's intermediate), random INT4 group 32
    (ExpertWeights), and their kernel pack with its seconds."""
    def rnd(out, inp):
        p = torch.randint(-2**31, 2**31 - 1, (MOE_E, out, inp // 8), dtype=torch.int32, device="cuda", generator=gen)
        s = (torch.rand(MOE_E, out, inp // 32, device="cuda", generator=gen) * 0.02 + 0.002).to(torch.bfloat16)
        return Int4Weight(p, s, 32)

    from ddtree_chat.engine.ops.cuda_moe import pack_experts

    ex = ExpertWeights(rnd(inter, MOE_H), rnd(inter, MOE_H), rnd(MOE_H, inter))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    pe = pack_experts(ex)
    torch.cuda.synchronize()
    return ex, pe, time.perf_counter() - t0


def k26_routed_tokens(t, gen):
    """t random bf16 hidden states, their top-k expert ids (uniform) and routing weights."""
    x = torch.randn(t, MOE_H, device="cuda").to(torch.bfloat16)
    ids = torch.rand(t, MOE_E, device="cuda", generator=gen).topk(MOE_K, dim=-1).indices
    return x, ids, torch.rand(t, MOE_K, device="cuda")


def mla_inputs(cache, ctx, t, nh):
    """Absorbed-MLA verify inputs: t queries x nh heads (latent 512 + rope 64, bf16) over ctx committed
    entries of `cache` [>= ctx + t, 576] plus the t tree entries (a chain: causal mask)."""
    q = torch.randn(t, nh, 512, device="cuda").to(torch.bfloat16) * 0.3
    qp = torch.randn(t, nh, 64, device="cuda").to(torch.bfloat16)
    mask = torch.ones(t, t, device="cuda").tril().bool()
    return q, qp, cache[: ctx + t, :512], cache[: ctx + t, 512:], mask


def mla_cost(ctx, t, nh):
    """Bytes that must move (the latent cache of ctx + t entries, q in and out, bf16) and FLOPs (scores and
    values over 576 / 512 columns) of one absorbed-MLA verify call."""
    return (ctx + t) * 576 * 2 + t * nh * (576 + 512) * 2, 2 * t * nh * (ctx + t) * (576 + 512)


def bench_moe(ceiling, quick):
    from ddtree_chat.engine.ops.cuda_moe import built_variants, moe_forward

    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for inter, name in ((MOE_I, "moe_int4"), (MOE_I // 8, "moe_int4 tp8")):  # whole experts, a TP=8 rank's slice
        ex, pe, pack_s = k26_experts(gen, inter)
        per_expert = 3 * inter * MOE_H // 2 + 3 * inter * (MOE_H // 32) * 2  # nibbles + bf16 scales
        for t in ([1, 8, 64] if quick else [1, 2, 4, 8, 16, 32, 64]):
            x, ids, w = k26_routed_tokens(t, gen)
            d = int(torch.unique(ids).numel())
            nbytes = d * per_expert + 2 * x.numel() * 2
            var_us = {v: graph_us(lambda: moe_forward(x, ids, w, pe, variant=v)) for v in built_variants()}
            best = min(var_us, key=var_us.get)
            us = var_us[best]
            us_eager = eager_us(lambda: moe_forward(x, ids, w, pe, variant=best), 20)
            ref_us = eager_us(lambda: moe_experts_ref(x, ids, w, ex), 2) if t in (1, 8, 64) else None
            rows.append(row(name, f"T={t} experts={d} v{best}", us, nbytes, ceiling, ref_us,
                            extra={"eager_us": us_eager, "pack_s": pack_s, "variant_us": var_us,
                                   "kernel_us": kernel_us(lambda: moe_forward(x, ids, w, pe, variant=best))}))
            print(rows[-1], flush=True)
        del ex, pe
    return rows


def bench_mla(ceiling, quick):
    from ddtree_chat.engine.ops.mla_attention import mla_attention_ref
    from ddtree_chat.engine.ops import triton_mla
    from ddtree_chat.engine.ops.triton_mla import graph_ms, mla_attention_triton

    rows = []
    ctxs = [8192, 131072] if quick else [8192, 32768, 131072]
    for ctx in ctxs:
        cache = torch.randn(ctx + 64, 576, device="cuda").to(torch.bfloat16)
        for nh in (64, 8):
            for t in (1, 16, 64):
                q, qp, ckv, kpe, mask = mla_inputs(cache, ctx, t, nh)
                nbytes, flops = mla_cost(ctx, t, nh)
                fn = lambda: mla_attention_triton(q, qp, ckv, kpe, ctx, mask, 0.14468)  # noqa: E731
                # NOTE: cold L2 (a flush before each call, subtracted): up to 32k keys the cache fits in the
                # 50 MB L2, so back-to-back replays flattered those rows; a 61-layer forward reads it cold
                us, warm_us = 1e3 * graph_ms(fn, cold=True), graph_us(fn)
                default_keys, default_waves, splits = triton_mla.MIN_SPLIT_KEYS, triton_mla.SPLIT_WAVES, {}
                for waves in (1, 2):  # the split plan's alternatives, same process
                    for keys in (64, 256, 1024):
                        triton_mla.MIN_SPLIT_KEYS, triton_mla.SPLIT_WAVES = keys, waves
                        splits[f"{waves}/{keys}"] = 1e3 * graph_ms(fn, cold=True)
                triton_mla.MIN_SPLIT_KEYS, triton_mla.SPLIT_WAVES = default_keys, default_waves
                ref_us = None
                if t == 1 and nh == 64:
                    ref_us = eager_us(lambda: mla_attention_ref(q, qp, ckv, kpe, ctx, mask, 0.14468), 3)
                rows.append(row("mla_verify", f"ctx={ctx} T={t} heads={nh}", us, nbytes, ceiling, ref_us, flops,
                                extra={"warm_us": warm_us, "us_by_waves_and_min_split_keys": splits}))
                print(rows[-1], flush=True)
        del cache
    print("MLA autotune choices:", json.dumps(triton_mla.tuned_configs(), indent=1), flush=True)
    return rows


EXACT_PRODUCTS = [("qkv_a", 2112, 7168), ("q_b", 12288, 1536), ("o_proj", 7168, 8192), ("shared_gate", 2048, 7168),
                  ("shared_down", 7168, 2048), ("dense_up", 18432, 7168), ("dense_down", 7168, 18432),
                  ("lm_head", 163840, 7168)]
# A rank's shares of those under TP=8 (parallel/shards.py: q_b, gate/up and the lm head split by rows, o_proj and
# down by columns, qkv_a replicated): separate (N, K) keys of triton_exact_linear.TILES
EXACT_PRODUCTS_TP8 = [("q_b/8", 1536, 1536), ("o_proj/8", 7168, 1024), ("shared_gate/8", 256, 7168),
                      ("shared_down/8", 7168, 256), ("dense_up/8", 2304, 7168), ("dense_down/8", 7168, 2304),
                      ("lm_head/8", 20480, 7168)]
# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, split multiplier): triton_exact_linear.TILES's candidates; the first is
# its DEFAULT_TILE. 32- and 64-row blocks let Hopper use wgmma; all fit an sm_120 block (test_triton_compile.py).
EXACT_TILES = [(16, 64, 64, 4, 4, 1.0), (16, 64, 128, 4, 3, 1.0), (16, 128, 64, 4, 4, 1.0), (16, 64, 64, 4, 4, 2.0),
               (16, 64, 64, 4, 4, 0.5), (32, 64, 64, 4, 4, 1.0), (32, 128, 64, 4, 3, 1.0), (64, 64, 64, 4, 4, 1.0),
               (64, 64, 64, 4, 4, 2.0), (64, 128, 64, 4, 3, 1.0), (64, 128, 64, 8, 3, 1.0), (64, 64, 128, 4, 3, 1.0),
               (64, 256, 64, 8, 2, 1.0)]
EXACT_ROWS = (1, 17, 65)


def exact_tile_name(t) -> str:
    return f"{t[0]}x{t[1]}x{t[2]} w{t[3]} s{t[4]} split*{t[5]}"


AR_SLACK = 1.03  # the AR step (one row) may cost this much over cuBLAS at most


def exact_winners(times: dict, lib: dict) -> dict:
    """times {tile: {M: us}} (a str value: the tile failed), lib {M: cuBLAS us, the fewest rows first} -> of
    the tiles whose one-row time is within AR_SLACK of cuBLAS the one whose slowest ratio over the row counts
    is least (one tile must serve every M; none within: the fastest at one row), its ratios, and each M's
    fastest."""
    ok = {t: by_m for t, by_m in times.items() if all(isinstance(by_m.get(m), float) for m in lib)}
    if not ok:
        return {}
    one = min(lib)
    worst = {t: max(by_m[m] / lib[m] for m in lib) for t, by_m in ok.items()}
    within = [t for t, by_m in ok.items() if by_m[one] <= AR_SLACK * lib[one]]
    best = min(within, key=worst.get) if within else min(ok, key=lambda t: ok[t][one])
    return {"tile": best, "worst_x_cublas": worst[best], "x_cublas": {m: ok[best][m] / lib[m] for m in lib},
            "fastest_by_m": {m: min(ok, key=lambda t: ok[t][m]) for m in lib}}


def bench_exact(ceiling, quick=False, shapes=EXACT_PRODUCTS, mla=True):
    """--only exact (or exact_products, exact_mla: its halves; exact_tp8: the products at a TP=8 rank's shapes): the
    row-invariant products (ops/triton_exact_linear) at `shapes` and 1 / 17 / 65 rows against cuBLAS in the same
    process, at every EXACT_TILES candidate (--quick: the table's tile only), then per shape the candidate to
    put in triton_exact_linear.TILES; and the row-invariant MLA against the SM-count split plan, with its
    sub-chunk fold forced off and on at 4 and 8 warps."""
    from ddtree_chat.engine.ops import triton_exact_linear as el
    from ddtree_chat.engine.ops import triton_mla_exact
    from ddtree_chat.engine.ops.triton_mla import graph_ms, mla_attention_triton
    from ddtree_chat.engine.ops.triton_mla_exact import mla_attention_exact

    rows, winners, default_warps = [], {}, (triton_mla_exact.WARPS, triton_mla_exact.HOPPER_BF16_WARPS)
    bm = triton_mla_exact.BLOCK_M  # the launch's query rows a program
    for name, n, k in shapes:
        w = torch.randn(n, k, device="cuda").to(torch.bfloat16)
        xs = {m: torch.randn(m, k, device="cuda").to(torch.bfloat16) for m in EXACT_ROWS}
        lib = {m: 1e3 * graph_ms(lambda: torch.nn.functional.linear(xs[m], w), cold=True) for m in EXACT_ROWS}
        table = el.TILES.get((n, k), el.DEFAULT_TILE)
        times = {}
        for cand in [] if quick else EXACT_TILES:
            el.TILES[(n, k)] = cand
            by_m = times[exact_tile_name(cand)] = {}
            try:
                for m in EXACT_ROWS:
                    by_m[m] = 1e3 * graph_ms(lambda: el.matmul_nt_exact(xs[m], w), cold=True)
            except Exception as e:  # a tile that does not fit
                by_m["error"] = repr(e)[:60]
            finally:
                el.TILES.pop((n, k))
                el.TILES.update({(n, k): table} if table is not el.DEFAULT_TILE else {})
        for m in EXACT_ROWS:
            us = 1e3 * graph_ms(lambda: el.matmul_nt_exact(xs[m], w), cold=True)
            rows.append(row("exact_linear", f"{name} M={m}", us, n * k * 2, ceiling, lib[m],
                            extra={"tile": el.tile(n, k, 1, torch.bfloat16, w.device, m),
                                   "us_by_tile": {t: by_m.get(m, by_m.get("error")) for t, by_m in times.items()}}))
            print(rows[-1], flush=True)
        winners[(n, k)] = exact_winners(times, lib)
        if winners[(n, k)]:
            win = winners[(n, k)]
            print(f"{name} ({n}, {k}): best {win['tile']}, x cuBLAS at M=1/17/65 "
                  + "/".join(f"{win['x_cublas'][m]:.2f}" for m in EXACT_ROWS)
                  + f"; the table's {exact_tile_name(table)}: "
                  + "/".join(f"{times[exact_tile_name(table)][m] / lib[m]:.2f}" for m in EXACT_ROWS
                             if isinstance(times.get(exact_tile_name(table), {}).get(m), float)), flush=True)
        del w, xs
    if any(winners.values()):
        print("triton_exact_linear.TILES from this run (M=1 within 3% of cuBLAS, then the least worst ratio):")
        by_name = {exact_tile_name(t): t for t in EXACT_TILES}
        for (n, k), win in winners.items():  # DEFAULT_TILE's winners stay out of the table (commented)
            if win:
                print(f"    {'# ' if by_name[win['tile']] == el.DEFAULT_TILE else ''}({n}, {k}): "
                      f"{by_name[win['tile']]},  # x cuBLAS "
                      + "/".join(f"{win['x_cublas'][m]:.2f}" for m in EXACT_ROWS))
        rows.append({"kernel": "exact_linear_winners", "shape": "all", "us": float("nan"), "GBps": float("nan"),
                     "frac_ceiling": float("nan"), "winners": {f"{n}x{k}": v for (n, k), v in winners.items()}})
    # NOTE: 32 query rows a program read each key tile for twice the rows (8 warps: at 4 they spill,
    # triton_resources.py --block-m 32)
    mla_alternatives = [(f, w, bm) for f in (False, True) for w in (4, 8)] + [(f, 8, 2 * bm) for f in (False, True)]
    for ctx in (8192, 32768, 131072) if mla else ():
        cache = torch.randn(ctx + 64, 576, device="cuda").to(torch.bfloat16)
        for nh in (64, 8):
            for t in (1, 17, 65):
                q, qp, ckv, kpe, mask = mla_inputs(cache, ctx, t, nh)
                nbytes, flops = mla_cost(ctx, t, nh)
                old_us = 1e3 * graph_ms(lambda: mla_attention_triton(q, qp, ckv, kpe, ctx, mask, 0.14468), cold=True)
                fn = lambda: mla_attention_exact(q, qp, ckv, kpe, ctx, mask, 0.14468)  # noqa: E731
                us, by_fold = 1e3 * graph_ms(fn, cold=True), {}
                for fold, warps, block_m in [] if quick else mla_alternatives:
                    triton_mla_exact.FOLD = fold  # the alternatives, same process
                    triton_mla_exact.WARPS = triton_mla_exact.HOPPER_BF16_WARPS = warps
                    triton_mla_exact.BLOCK_M = block_m
                    try:
                        label = f"{'sub' if fold else 'chunk'} w{warps}" + (f" m{block_m}" if block_m != bm else "")
                        by_fold[label] = 1e3 * graph_ms(fn, cold=True)
                    finally:
                        triton_mla_exact.FOLD, triton_mla_exact.BLOCK_M = None, bm
                        triton_mla_exact.WARPS, triton_mla_exact.HOPPER_BF16_WARPS = default_warps
                rows.append(row("exact_mla", f"ctx={ctx} T={t} heads={nh}", us, nbytes, ceiling, old_us, flops,
                                extra={"us_by_fold": by_fold,
                                       "layout": triton_mla_exact.layout(t, nh, ctx, ckv.device)}))
                print(rows[-1], flush=True)
        del cache
    return rows


def bench_exact_block_m(ceiling, shapes=EXACT_PRODUCTS):
    """--only exact_block_m: the fact triton_exact_linear.block_m rests on, and the times it picks from. For each
    shape's table tile, BLOCK_M = 16 / 32 / 64 with the rest fixed (same BLOCK_N, BLOCK_K, split) at 1 / 17 / 65
    rows: every output bit compared with BLOCK_M = 16's on the same rows (Hopper: mma.sync vs wgmma), and
    the first row against the one-row launch's; the times beside them, and block_m's pick per row count."""
    from ddtree_chat.engine.ops import triton_exact_linear as el
    from ddtree_chat.engine.ops.triton_mla import graph_ms

    rows, rule = [], el.block_m
    el.block_m = lambda bm, n, m: bm  # NOTE: the table's BLOCK_M as set below, at every row count
    for name, n, k in shapes:
        w = torch.randn(n, k, device="cuda").to(torch.bfloat16)
        x = torch.randn(max(EXACT_ROWS), k, device="cuda").to(torch.bfloat16)
        table = el.TILES.get((n, k), el.DEFAULT_TILE)
        outs, us = {}, {}
        try:
            for bm in (16, 32, 64):
                el.TILES[(n, k)] = (bm,) + tuple(table[1:])
                for m in EXACT_ROWS:
                    outs[bm, m] = el.matmul_nt_exact(x[:m], w)
                    us[bm, m] = 1e3 * graph_ms(lambda: el.matmul_nt_exact(x[:m], w), cold=True)
        finally:
            el.TILES.pop((n, k))
            el.TILES.update({(n, k): table} if table is not el.DEFAULT_TILE else {})
        same = {f"bm{bm} M={m}": bool(torch.equal(outs[bm, m].view(torch.int16), outs[16, m].view(torch.int16)))
                for bm in (32, 64) for m in EXACT_ROWS}
        first_row = {f"bm{bm} M={m}": bool(torch.equal(outs[bm, m][:1].view(torch.int16),
                                                       outs[16, 1].view(torch.int16)))
                     for bm in (16, 32, 64) for m in EXACT_ROWS}
        r = {"kernel": "exact_block_m", "shape": name, "us": us[16, 1], "GBps": float("nan"),
             "frac_ceiling": float("nan"), "same_as_bm16": same, "first_row_as_one_row_bm16": first_row,
             "us_by_bm": {f"bm{bm} M={m}": t for (bm, m), t in us.items()}, "tile": list(table)}
        rows.append(r)
        print(name, "all bits equal" if all(same.values()) and all(first_row.values()) else "DIFFER",
              same, first_row, {kk: round(v, 1) for kk, v in r["us_by_bm"].items()},
              "block_m picks", {m: rule(table[0], n, m) for m in EXACT_ROWS}, flush=True)
        del w, x, outs
    el.block_m = rule
    return rows


def bench_cuda_mla(ceiling, quick=False):
    """--only cuda_mla: csrc/mla_attention.cu (its default plan and the alternatives) side by side with the
    row-invariant Triton kernel and the SM-count-planned Triton kernel, cold L2, same inputs."""
    from ddtree_chat.engine.ops import cuda_mla
    from ddtree_chat.engine.ops.triton_mla import graph_ms, mla_attention_triton
    from ddtree_chat.engine.ops.triton_mla_exact import mla_attention_exact

    rows = []
    plans = [{"F": f, "cs": cs, "stages": st, "rg": 1} for f in (1, 8) for cs in (1, 2, 4) for st in (2, 4)]
    plans += [{"F": f, "stages": st, "rg": 2} for f in (1, 8) for st in (2, 4)]
    # the narrow engine's plans, then the wide engine's where it runs (elsewhere a wide entry would time the narrow)
    wide = [{"wide": 1, "F": 1, "FC": 1}, {"wide": 1, "F": 1}, {"wide": 1, "F": 8}] \
        if cuda_mla.wide_fits(torch.device("cuda")) else []
    for ctx in (8192, 32768, 131072):
        cache = torch.randn(ctx + 64, 576, device="cuda").to(torch.bfloat16)
        for nh in (8, 64):
            for t in (1, 17, 65):
                q, qp, ckv, kpe, mask = mla_inputs(cache, ctx, t, nh)
                nbytes, flops = mla_cost(ctx, t, nh)
                fn = lambda: cuda_mla.mla_attention_cuda(q, qp, ckv, kpe, ctx, mask, 0.14468)  # noqa: E731
                us = 1e3 * graph_ms(fn, cold=True)
                by_plan = {}
                # quick: the default plan with one (a CTA per chunk and per the plan's FC chunks) and with two row
                # groups a CTA (the rest as the plan picks), and the wide engine's (64-row CTAs) with a CTA per
                # chunk, per the plan's FC chunks, and per super
                narrow = [{"rg": 1, "wide": 0, "FC": 1}, {"rg": 1, "wide": 0}, {"rg": 2, "wide": 0}]
                for force in narrow + wide if quick else [{**p, "wide": 0} for p in plans] + wide:
                    cuda_mla.FORCE = force
                    try:
                        name = " ".join(f"{k}{v}" for k, v in cuda_mla.device_plan(t, nh, ctx, q.device).items()
                                        if k in ("F", "FC", "cs", "rg", "stages", "wide"))
                        by_plan[name] = 1e3 * graph_ms(fn, cold=True)
                    finally:
                        cuda_mla.FORCE = {}
                exact_us = 1e3 * graph_ms(lambda: mla_attention_exact(q, qp, ckv, kpe, ctx, mask, 0.14468), cold=True)
                sm_us = 1e3 * graph_ms(lambda: mla_attention_triton(q, qp, ckv, kpe, ctx, mask, 0.14468), cold=True)
                chosen = cuda_mla.device_plan(t, nh, ctx, q.device)
                # where each call's time goes: its kernels' device time (warm L2: the merge reads what the main
                # kernel just wrote, as inside a forward)
                split = {"cuda": kernel_us(fn),
                         "triton_exact": kernel_us(lambda: mla_attention_exact(q, qp, ckv, kpe, ctx, mask, 0.14468))}
                if wide:
                    cuda_mla.FORCE = {"wide": 1}
                    try:
                        split["cuda_wide"] = kernel_us(fn)
                    finally:
                        cuda_mla.FORCE = {}
                rows.append(row("cuda_mla", f"ctx={ctx} T={t} heads={nh}", us, nbytes, ceiling, None, flops,
                                extra={"triton_exact_us": exact_us, "triton_sm_plan_us": sm_us, "plan": chosen,
                                       "us_by_plan": by_plan, "x_triton_exact": exact_us / us,
                                       "kernel_us": split}))
                print(rows[-1], flush=True)
        del cache
    return rows


def exact_mla_split(fn) -> dict:
    """A row-invariant MLA call fn: its time (graph-replayed, cold L2) and its main kernel's and merge's device time,
    us."""
    from ddtree_chat.engine.ops.triton_mla import graph_ms

    split = kernel_us(fn)
    return {"call_us": 1e3 * graph_ms(fn, cold=True),
            "merge_us": sum(v for k, v in split.items() if "_merge_kernel" in k),
            "main_us": sum(v for k, v in split.items() if "_mla_exact_kernel" in k)}


def bench_exact_merge(ceiling):
    """--only exact_merge: the row-invariant MLA's merge at several lane and column layouts (BLOCK_S, BLOCK_R):
    the one before (16, 128), the two merge_layout picks by head count and those between, same inputs, same
    process; the merge kernel's device time and the call's (cold L2), at a TP=8 rank's 8 heads and at 64."""
    from unittest import mock

    from ddtree_chat.engine.ops import triton_mla_exact as ex

    layouts = sorted({(16, 128), (32, 64), (64, 32), (128, 32), ex.MERGE_FEW, ex.MERGE_MANY})
    rows = []
    for ctx in (8192, 32768, 131072):
        cache = torch.randn(ctx + 80, 576, device="cuda").to(torch.bfloat16)
        for nh, t in ((8, 1), (8, 17), (8, 65), (64, 1), (64, 17), (64, 65)):
            q, qp, ckv, kpe, mask = mla_inputs(cache, ctx, t, nh)
            plen = torch.tensor([ctx], device="cuda", dtype=torch.int32)  # a device length, bounded (engine: exactcap)
            fn = lambda: ex.mla_attention_exact(q, qp, ckv, kpe, plen, mask, 0.14468, max_prefix=ctx)  # noqa: E731
            by = {}
            for s, r in layouts:
                with mock.patch.object(ex, "merge_layout", lambda heads, sr=(s, r): sr):
                    by[f"S{s} R{r}"] = exact_mla_split(fn)
            nbytes, flops = mla_cost(ctx, t, nh)
            now = ex.merge_layout(nh)
            rows.append(row("exact_merge", f"ctx={ctx} T={t} heads={nh}", by[f"S{now[0]} R{now[1]}"]["call_us"],
                            nbytes, ceiling, None, flops, extra={"by_layout": by}))
            print(rows[-1]["shape"], by, flush=True)
        del cache
    return rows


def bench_exact_chunk(ceiling):
    """--only exact_chunk: the row-invariant MLA at a TP=8 rank's 8 heads with chunks of 512 (today's) to 4096
    keys (chunk_keys patched; the arithmetic changes with it, so a pick would be one length per head count),
    same inputs, same process: the call (graph-replayed, cold L2), main and merge device time, the programs per
    chunk the launch took (F), and the SM-count-planned kernel's call beside. Longer chunks store fewer
    partials per row (a 65-token tree at 131k keys: 268 MB at 512) but give a few-row launch longer folds."""
    from unittest import mock

    from ddtree_chat.engine.ops import triton_mla_exact as ex
    from ddtree_chat.engine.ops.triton_mla import graph_ms, mla_attention_triton

    rows, nh = [], 8
    for ctx in (8192, 32768, 131072):
        cache = torch.randn(ctx + 80, 576, device="cuda").to(torch.bfloat16)
        for t in (1, 17, 65):
            q, qp, ckv, kpe, mask = mla_inputs(cache, ctx, t, nh)
            plen = torch.tensor([ctx], device="cuda", dtype=torch.int32)  # a device length, bounded (engine: exactcap)
            fn = lambda: ex.mla_attention_exact(q, qp, ckv, kpe, plen, mask, 0.14468, max_prefix=ctx)  # noqa: E731
            sm = 1e3 * graph_ms(lambda: mla_attention_triton(q, qp, ckv, kpe, ctx, mask, 0.14468), cold=True)
            by = {}
            for chunk in (512, 1024, 2048, 4096):
                try:
                    with mock.patch.object(ex, "chunk_keys", lambda heads, c=chunk: c):
                        by[f"C{chunk}"] = dict(exact_mla_split(fn), F=ex.layout(t, nh, ctx, q.device)[2])
                except Exception as e:  # NOTE: a length that does not build still leaves the others' figures
                    by[f"C{chunk}"] = {"error": repr(e)[:200]}
            nbytes, flops = mla_cost(ctx, t, nh)
            rows.append(row("exact_chunk", f"ctx={ctx} T={t} heads={nh}", by["C512"].get("call_us", float("nan")),
                            nbytes, ceiling, sm, flops, extra={"by_chunk": by}))
            print(rows[-1]["shape"], f"SM plan {sm:.1f}", by, flush=True)
        del cache
    return rows


def bench_exact_capacity(ceiling):
    """--only exact_capacity: what the engine's recorded programs pay for planning attention over the whole cache.
    A graph replays at any length, so the engine passes the committed length as a device tensor and no bound
    (ops.mla_attention): the row-invariant kernel then sizes its launch, and picks its programs per chunk, for
    every slot of the cache (idle programs past the prefix still start). Here a 4k-key prefix in caches of 8k,
    32k and 131k slots, bounded as the engine does (none) and by the prefix (max_prefix), and the SM-count plan's
    kernel the same two ways; call us, graph-replayed, cold L2."""
    from ddtree_chat.engine.ops import triton_mla_exact as ex
    from ddtree_chat.engine.ops.triton_mla import graph_ms, mla_attention_triton

    rows, ctx = [], 4096
    plen = torch.tensor([ctx], device="cuda", dtype=torch.int32)
    for slots in (8192, 32768, 131072):
        cache = torch.randn(slots, 576, device="cuda").to(torch.bfloat16)
        for nh, t in ((8, 1), (8, 17), (8, 65), (64, 1), (64, 17)):
            q, qp, _, _, mask = mla_inputs(cache, ctx, t, nh)
            ckv, kpe = cache[:, :512], cache[:, 512:]  # the whole cache, as the engine's programs see it
            by = {}
            for name, bound in (("engine", None), ("bounded", ctx)):
                args = (q, qp, ckv, kpe, plen, mask, 0.14468)
                exact_us = 1e3 * graph_ms(lambda: ex.mla_attention_exact(*args, max_prefix=bound), cold=True)
                sm_us = 1e3 * graph_ms(lambda: mla_attention_triton(*args, max_prefix=bound), cold=True)
                by[name] = {"exact_us": exact_us, "sm_plan_us": sm_us,
                            "F": ex.layout(t, nh, slots - t if bound is None else bound, q.device)[2]}
            nbytes, flops = mla_cost(ctx, t, nh)
            rows.append(row("exact_capacity", f"slots={slots} ctx={ctx} T={t} heads={nh}", by["engine"]["exact_us"],
                            nbytes, ceiling, by["bounded"]["exact_us"], flops, extra={"by_bound": by}))
            print(rows[-1]["shape"], by, flush=True)
        del cache
    return rows


def bench_exact_demo(ceiling):
    """--only exact_demo: the row-invariant MLA at the demo target's shapes (4 heads, a 64-wide latent + 16 rope,
    float32) in a 32k-slot cache (the GPU engine's default), 150 / 400 / 2000 committed keys, 1 and 17 tokens: the
    call planned as the engine plans it (no bound: the whole cache) and bounded by the prefix, the SM-count plan's
    kernel the same two ways, and the row-invariant kernel with 4 warps, one program per chunk (FOLD False) and
    32-key sub-chunks (SUB_KEYS 32; other bits); graph-replayed call us (warm L2) and one profiled call's kernels."""
    from torch.profiler import ProfilerActivity, profile

    from ddtree_chat.engine.ops import triton_mla_exact as ex
    from ddtree_chat.engine.ops.triton_mla import graph_ms, mla_attention_triton

    slots, nh, r, p = 32768, 4, 64, 16
    cache = torch.randn(slots, r + p, device="cuda")
    rows = []

    def timed(fn) -> dict:
        us = 1e3 * graph_ms(fn, cold=False)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        kernels = {e.key[:24]: e.self_device_time_total / max(e.count, 1) for e in prof.key_averages()
                   if e.self_device_time_total > 0}
        return {"call_us": us, "kernel_us": kernels}

    for ctx in (150, 400, 2000):
        for t in (1, 17):
            q, qp = torch.randn(t, nh, r, device="cuda") * 0.3, torch.randn(t, nh, p, device="cuda")
            mask = torch.ones(t, t, device="cuda").tril().bool()
            args = (q, qp, cache[:, :r], cache[:, r:], torch.tensor([ctx], device="cuda", dtype=torch.int32), mask,
                    0.125)
            by = {"exact engine": timed(lambda: ex.mla_attention_exact(*args)),
                  "exact bounded": timed(lambda: ex.mla_attention_exact(*args, max_prefix=ctx)),
                  "sm engine": timed(lambda: mla_attention_triton(*args)),
                  "sm bounded": timed(lambda: mla_attention_triton(*args, max_prefix=ctx))}
            for name, attr, value in (("warps4", "WARPS", 4), ("F1", "FOLD", False), ("sub32", "SUB_KEYS", 32)):
                old = getattr(ex, attr)
                setattr(ex, attr, value)
                try:
                    by[f"exact engine {name}"] = timed(lambda: ex.mla_attention_exact(*args))
                    if name == "sub32":
                        by["exact bounded sub32"] = timed(lambda: ex.mla_attention_exact(*args, max_prefix=ctx))
                finally:
                    setattr(ex, attr, old)
            nbytes = (ctx + t) * (r + p) * 4 + t * nh * (2 * r + p) * 4
            rows.append(row("exact_demo", f"ctx={ctx} T={t} heads={nh}", by["exact engine"]["call_us"], nbytes,
                            ceiling, by["sm engine"]["call_us"], extra={"by_plan": by}))
            print(rows[-1]["shape"], {k: round(v["call_us"], 1) for k, v in by.items()}, flush=True)
    return rows


def profile_once():
    """--only ncu: the MoE (1 / 16 / 64 tokens) and MLA (131072 keys, 64 and 8 heads, 1 and 16 tokens, and 64 at
    8 heads; the Triton kernel and csrc/mla_attention.cu, and at 8 heads the row-invariant Triton kernel the engine
    launches by default) shapes once each inside an NVTX range "ncu", after an untimed
    call outside it (compiles, autotunes), for Nsight Compute to read the hardware counters of just those
    launches (BENCHMARKS.md has the command). No rows."""
    from ddtree_chat.engine.ops.cuda_mla import mla_attention_cuda
    from ddtree_chat.engine.ops.cuda_moe import moe_forward
    from ddtree_chat.engine.ops.triton_mla import mla_attention_triton
    from ddtree_chat.engine.ops.triton_mla_exact import mla_attention_exact

    gen = torch.Generator(device="cuda").manual_seed(0)
    calls = []
    _, pe, _ = k26_experts(gen)
    for t in (1, 16, 64):
        x, ids, w = k26_routed_tokens(t, gen)
        calls.append((f"moe T={t}", lambda x=x, ids=ids, w=w: moe_forward(x, ids, w, pe)))
    ctx = 131072
    cache = torch.randn(ctx + 16, 576, device="cuda").to(torch.bfloat16)
    for nh in (64, 8):
        for t in (1, 16) if nh == 64 else (1, 16, 64):  # NOTE: 64 at 8 heads: a tree's 16-row programs re-read the keys
            args = mla_inputs(cache, ctx, t, nh)  # q, q_pe, ckv, kpe, mask
            kernels = [("mla", mla_attention_triton), ("cuda_mla", mla_attention_cuda)]
            if nh == 8:  # a TP=8 rank's heads: also the engine's default kernel
                kernels.append(("mla_exact", mla_attention_exact))
            for name, attend in kernels:
                calls.append((f"{name} ctx={ctx} T={t} heads={nh}",
                              lambda a=args, f=attend: f(*a[:4], ctx, a[4], 0.14468)))
    for name, fn in calls:
        fn()
        torch.cuda.synchronize()
        with torch.cuda.nvtx.range("ncu"):
            fn()
        torch.cuda.synchronize()
        print("profiled", name, flush=True)
    return []


def profile_wide():
    """--only ncuwide: the wide CUDA MLA engine (csrc/mla_wide.cu) at 131072 keys, 8 heads x 1 / 17 tokens and 64
    heads x 17, once each inside an NVTX range "ncu" after an untimed call, for Nsight Compute's counters. No rows."""
    from ddtree_chat.engine.ops import cuda_mla

    if not cuda_mla.wide_fits(torch.device("cuda")):
        print("the wide engine does not run on this GPU (Hopper only): nothing to profile", flush=True)
        return []
    ctx = 131072
    cache = torch.randn(ctx + 32, 576, device="cuda").to(torch.bfloat16)
    cuda_mla.FORCE = {"wide": 1}
    try:
        for nh, t in ((8, 1), (8, 17), (64, 17)):
            args = mla_inputs(cache, ctx, t, nh)  # q, q_pe, ckv, kpe, mask
            fn = lambda a=args: cuda_mla.mla_attention_cuda(*a[:4], ctx, a[4], 0.14468)  # noqa: E731
            fn()
            torch.cuda.synchronize()
            with torch.cuda.nvtx.range("ncu"):
                fn()
            torch.cuda.synchronize()
            print("profiled", nh, t, cuda_mla.device_plan(t, nh, ctx, cache.device), flush=True)
    finally:
        cuda_mla.FORCE = {}
    return []


def bench_small(ceiling):
    from ddtree_chat.engine.ops.cuda_small import rms_norm_fast, rms_norm_residual_fast, route_fast
    from ddtree_chat.engine.ops.norm import rms_norm_ref
    from ddtree_chat.engine.ops.rope import apply_rope_interleaved_ref
    from ddtree_chat.engine.ops.latent import latent_write_ref
    from ddtree_chat.engine.ops.triton_norm import rms_norm_triton
    from ddtree_chat.engine.ops.triton_latent import latent_write_triton
    from ddtree_chat.engine.ops.triton_rope import rope_triton
    from ddtree_chat.engine.ops.router import route_ref
    from ddtree_chat.engine.ops.topk import topk_logprobs_ref
    from ddtree_chat.engine.ops.triton_topk import topk_logprobs_triton

    rows = []
    for t in (1, 64, 256):
        lg = torch.randn(t, 384, device="cuda")
        b = torch.randn(384, device="cuda") * 0.1
        us = graph_us(lambda: route_fast(lg, b, 8, 2.827, True))
        ref = graph_us(lambda: route_ref(lg, b, 8, 2.827))
        rows.append(row("router", f"T={t} E=384 top8", us, lg.numel() * 4 + 1536, ceiling, ref))
        x = torch.randn(t, 7168, device="cuda").to(torch.bfloat16)
        r = torch.randn(t, 7168, device="cuda").to(torch.bfloat16)
        wt = torch.rand(7168, device="cuda").to(torch.bfloat16)
        us = graph_us(lambda: rms_norm_fast(x, wt, 1e-6))
        ref = graph_us(lambda: rms_norm_ref(x, wt, 1e-6))
        rows.append(row("rms_norm", f"T={t} D=7168", us, 2 * x.numel() * 2, ceiling, ref))
        us = graph_us(lambda: rms_norm_residual_fast(x, r, wt, 1e-6))
        ref = graph_us(lambda: rms_norm_ref(x + r, wt, 1e-6))
        rows.append(row("rms_norm+residual", f"T={t} D=7168", us, 4 * x.numel() * 2, ceiling, ref))
        # the Triton row norm (wide rows) against the CUDA kernel in the same process ("torch" column: CUDA)
        cuda_us = graph_us(lambda: rms_norm_fast(x, wt, 1e-6))
        us = graph_us(lambda: rms_norm_triton(x, None, wt, 1e-6))
        rows.append(row("rms_norm triton vs cuda", f"T={t} D=7168", us, 2 * x.numel() * 2, ceiling, cuda_us))
        cuda_us = graph_us(lambda: rms_norm_residual_fast(x, r, wt, 1e-6))
        us = graph_us(lambda: rms_norm_triton(x, r, wt, 1e-6))
        rows.append(row("rms_norm+residual triton vs cuda", f"T={t} D=7168", us, 4 * x.numel() * 2, ceiling, cuda_us))
        # rope on q's rope slice at K2.6 shapes ([T, 64 heads, 128 + 64], bf16): the kernel vs the reference
        q = torch.randn(t, 64, 192, device="cuda").to(torch.bfloat16)[..., 128:]
        cos, sin = (torch.rand(t, 32, device="cuda").to(torch.bfloat16) for _ in range(2))
        us = graph_us(lambda: rope_triton(q, cos, sin, True, True))
        ref = graph_us(lambda: apply_rope_interleaved_ref(q, cos, sin, heads=True))
        rows.append(row("rope", f"T={t} h=64 d=64", us, 2 * q.numel() * 2 + 2 * cos.numel() * 2, ceiling, ref))
        # the latent cache write (norm c_kv + rope k_pe + store at graph slots) of K2.6's kv_a slice
        kv = torch.randn(t, 1536 + 576, device="cuda").to(torch.bfloat16)[:, 1536:]
        ckv, kpe = (torch.zeros(8192, n, device="cuda", dtype=torch.bfloat16) for n in (512, 64))
        slots = torch.arange(4096, 4096 + t, device="cuda")
        w5 = wt[:512]
        us = graph_us(lambda: latent_write_triton(kv, w5, 1e-6, cos, sin, ckv, kpe, slots))
        ref = graph_us(lambda: latent_write_ref(kv, w5, 1e-6, cos, sin, ckv, kpe, slots))
        rows.append(row("latent_write", f"T={t} r=512 p=64", us, 2 * kv.numel() * 2 + 2 * cos.numel() * 2 + 1024,
                        ceiling, ref))
        for rr in rows[-7:]:
            print(rr, flush=True)
    # the drafter's candidates: top-k log-softmax over the vocabulary for its 7 block rows (float32 logits)
    for v, k in ((8192, 1), (8192, 32), (8192, 256), (163840, 1), (163840, 32), (163840, 64), (163840, 128)):
        lg = torch.randn(7, v, device="cuda")
        us = graph_us(lambda: topk_logprobs_triton(lg, k))
        ref = graph_us(lambda: topk_logprobs_ref(lg, k))
        rows.append(row("topk_logprobs", f"R=7 V={v} k={k}", us, lg.numel() * 4, ceiling, ref))
        print(rows[-1], flush=True)
    return rows


def bench_linear(ceiling):
    """float32 small-M products at the demo pair's shapes (tree verify / drafter block rows): the Triton
    kernel vs torch (cuBLAS / cuBLASLt as the engine sets it), both graph-replayed, and each one's error
    against a float64 product (relative Frobenius)."""
    import triton

    from ddtree_chat.engine.ops.triton_linear import MAX_K, SPLIT_K_CHUNK, matmul_nt_triton

    torch.backends.cuda.preferred_blas_library("cublaslt")
    rows = []
    for m in (1, 8, 33, 65, 257):
        for k, n in ((256, 128), (128, 256), (256, 80), (256, 2048), (256, 8192), (768, 256), (1536, 256)):
            x = torch.randn(m, k, device="cuda")
            w = torch.randn(n, k, device="cuda")
            exact = x.double() @ w.double().T
            err = lambda y: rel_err(y, exact)  # noqa: E731
            ref = graph_us(lambda: torch.nn.functional.linear(x, w))
            for prec in ("ieee", "tf32x3"):
                us = graph_us(lambda: matmul_nt_triton(x, w, prec))
                rows.append(row(f"matmul_nt {prec}", f"M={m} K={k} N={n}", us, (x.numel() + w.numel() + m * n) * 4,
                                ceiling, ref, extra={"rel_err": err(matmul_nt_triton(x, w, prec)),
                                                     "torch_rel_err": err(torch.nn.functional.linear(x, w))}))
                print(rows[-1], flush=True)
            if k > MAX_K:  # split-K in one launch (what matmul_nt_fast takes from 2 rows)
                split = triton.cdiv(k, SPLIT_K_CHUNK)
                us = graph_us(lambda: matmul_nt_triton(x, w, split=split))
                rows.append(row(f"matmul_nt split-K {split}", f"M={m} K={k} N={n}", us,
                                (x.numel() + w.numel() + m * n) * 4, ceiling, ref,
                                extra={"rel_err": err(matmul_nt_triton(x, w, split=split))}))
                print(rows[-1], flush=True)
            if k <= MAX_K:  # the GLU form (gate/up of a SwiGLU MLP) against its four cuBLAS-side kernels
                w2 = torch.randn(n, k, device="cuda")
                us = graph_us(lambda: matmul_nt_triton(x, w, w2=w2))
                ref = graph_us(lambda: torch.nn.functional.silu(x @ w.T) * (x @ w2.T))
                rows.append(row("matmul_nt_glu tf32x3", f"M={m} K={k} N={n}", us,
                                (x.numel() + 2 * w.numel() + m * n) * 4, ceiling, ref))
                print(rows[-1], flush=True)
    return rows


# (K, N, batch) of the demo target's products in a verify (q_a, q_b, kv_a, the MLA absorption pair,
# o_proj, router, lm head) and the SwiGLU gate/up pairs (GLU: shared expert, dense MLP)
TILE_SHAPES = [(256, 128, 1), (128, 192, 1), (256, 80, 1), (32, 64, 4), (64, 32, 4), (128, 256, 1),
               (256, 16, 1), (256, 8192, 1)]
TILE_GLU_SHAPES = [(256, 128), (256, 768)]
TILES = [None, (16, 16, 64, 2, 3), (16, 16, 128, 4, 2), (16, 32, 64, 4, 3), (16, 32, 128, 4, 2),
         (16, 64, 64, 4, 3), (32, 16, 64, 2, 3), (32, 32, 64, 4, 3), (64, 16, 64, 4, 3)]


# candidate MLA tiles beyond the autotuner's (BLOCK_M, BLOCK_N, warps, stages): with its list, an earlier
# sweep (BENCHMARKS.md), whose winners joined the list and whose losers are these; then deeper
# pipelines of the one-token tiles (not yet run: more key bytes in flight per SM at 8
# heads, the target box's TP=8 shape, where one CTA per SM reached 51-54% of the ceiling)
MLA_EXTRA_TILES = [(16, 64, 8, 2), (64, 32, 8, 3), (64, 16, 8, 3), (64, 32, 4, 3),
                   (16, 64, 4, 3), (16, 64, 4, 4), (16, 32, 4, 4)]


def bench_mla_tiles(ceiling):
    """The MLA kernel at K2.6 shapes for every tile (the autotuner's and MLA_EXTRA_TILES) and split size
    (graph-replayed, cold L2, fixed tile via config=): which tile and plan is fastest per shape."""
    import triton

    from ddtree_chat.engine.ops import triton_mla
    from ddtree_chat.engine.ops.triton_mla import graph_ms, mla_attention_triton

    tiles = list(triton_mla._CONFIGS) + [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=st)
                                          for bm, bn, w, st in MLA_EXTRA_TILES]
    rows, default_keys = [], triton_mla.MIN_SPLIT_KEYS
    for ctx in (8192, 131072):
        cache = torch.randn(ctx + 64, 576, device="cuda").to(torch.bfloat16)
        for nh in (8, 64):
            for t in (1, 16):
                q, qp, ckv, kpe, mask = mla_inputs(cache, ctx, t, nh)
                nbytes = mla_cost(ctx, t, nh)[0]
                times = {}
                for cfg in tiles:
                    kw = cfg.all_kwargs()
                    name = f"{kw['BLOCK_M']}x{kw['BLOCK_N']}w{kw['num_warps']}s{kw['num_stages']}"
                    for keys in (64, 256, 1024):
                        triton_mla.MIN_SPLIT_KEYS = keys
                        try:
                            times[f"{name}/{keys}"] = 1e3 * graph_ms(
                                lambda: mla_attention_triton(q, qp, ckv, kpe, ctx, mask, 0.14468, config=cfg), cold=True)
                        except Exception as e:  # e.g. out of shared memory for this tile
                            times[f"{name}/{keys}"] = float("inf")
                            print(name, "failed:", str(e).splitlines()[0][:120], flush=True)
                triton_mla.MIN_SPLIT_KEYS = default_keys
                best = min(times, key=times.get)
                rows.append(row("mla_tile", f"ctx={ctx} T={t} heads={nh}", times[best], nbytes, ceiling,
                                extra={"best": best, "times": times}))
                top = sorted(times, key=times.get)[:5]
                print(rows[-1]["shape"], " ".join(f"{k} {times[k]:.1f}" for k in top), flush=True)
        del cache
    return rows


def bench_tiles(ceiling):
    """The small-M product's tile choices at the demo's verify shapes (graph-replayed, float32 tf32x3):
    None is the shipped rule (triton_linear._tile); the rows say which tile is fastest per shape."""
    from ddtree_chat.engine.ops.triton_linear import matmul_nt_triton

    rows = []
    shapes = [(k, n, b, False) for k, n, b in TILE_SHAPES] + [(k, n, 1, True) for k, n in TILE_GLU_SHAPES]
    for m in (8, 17, 33, 65):
        for k, n, b, glu in shapes:
            x = torch.randn(b, m, k, device="cuda")[0 if b == 1 else slice(None)]
            w = torch.randn(b, n, k, device="cuda")[0 if b == 1 else slice(None)]
            w2 = torch.randn_like(w) if glu else None
            times = {}
            for tile in TILES:
                times[str(tile)] = graph_us(lambda: matmul_nt_triton(x, w, w2=w2, tile=tile))
            for split in (2, 4) if k >= 128 and not glu else ():  # K over programs, the shipped tile
                times[f"split{split}"] = graph_us(lambda: matmul_nt_triton(x, w, split=split))
            best = min(times, key=times.get)
            rows.append(row(f"tile{' glu' if glu else ''}", f"M={m} K={k} N={n} B={b}", times[best],
                            (x.numel() + w.numel() * (2 if glu else 1) + b * m * n) * 4, ceiling,
                            extra={"best": best, "shipped_us": times["None"], "times": times}))
            print(rows[-1]["shape"], "shipped", f"{times['None']:.1f}", "best", best, f"{times[best]:.1f}", flush=True)
    return rows


# FFMA tiles of the small-M product (BLOCK_N, BLOCK_K, warps, stages; BLOCK_M = rows up to 16): the
# broadcast [BM, BK, BN] is 16-64 float32 values per thread. NOTE: under 16 columns only: Triton (3.6)
# turns a broadcast sum whose three sides are all >= 16 into a tensor-core dot in plain TF32 (7.7e-4
# relative error), which is no longer the float32 product this form is for.
FMA_TILES = [(8, 64, 4, 3), (8, 32, 4, 3), (4, 128, 4, 2), (8, 128, 8, 2), (4, 256, 8, 1), (4, 64, 4, 3),
             (8, 256, 8, 1)]


def bench_fma(ceiling):
    """The small-M product in FFMA form ("fma": K spread over lanes) against tensor-core tf32x3 dots (the
    shape rule's tile) and cuBLAS, at the demo's verify shapes and 1 / 8 / 17 / 33 / 65 rows
    (graph-replayed; the GLU rows time cuBLAS as two products, the SiLU and the product). Each FFMA tile's
    relative error against float64 is recorded too, and from 16 rows a 16 x 16 x 32 probe tile's ("probe16":
    Triton 3.6 turned it into a plain-TF32 dot, ~8e-4; the FFMA tiles stay ~1e-7)."""
    from ddtree_chat.engine.ops.triton_linear import matmul_nt_triton

    rows = []
    shapes = [(k, n, b, False) for k, n, b in TILE_SHAPES] + [(k, n, 1, True) for k, n in TILE_GLU_SHAPES]
    for m in (1, 8, 17, 33, 65):
        bm = min(16, 1 << (m - 1).bit_length())
        for k, n, b, glu in shapes:
            x = torch.randn(b, m, k, device="cuda")[0 if b == 1 else slice(None)]
            w = torch.randn(b, n, k, device="cuda")[0 if b == 1 else slice(None)]
            w2 = torch.randn_like(w) if glu else None
            mm = lambda a, c: torch.matmul(a, c.transpose(-1, -2))  # noqa: E731
            exact = mm(x.double(), w.double())
            if glu:
                exact = torch.nn.functional.silu(exact) * mm(x.double(), w2.double())
            times = {"cublas": graph_us((lambda: torch.nn.functional.silu(mm(x, w)) * mm(x, w2)) if glu
                                        else (lambda: mm(x, w)))}
            times["tf32x3"] = graph_us(lambda: matmul_nt_triton(x, w, w2=w2))
            errors = {}
            tiles = [(f"fma {t}", t) for t in ((bm,) + c for c in FMA_TILES)] + ([("probe16", (16, 16, 32, 4, 3))]
                                                                                 if bm == 16 else [])
            for name, tile in tiles:
                times[name] = graph_us(lambda: matmul_nt_triton(x, w, precision="fma", w2=w2, tile=tile))
                errors[name] = rel_err(matmul_nt_triton(x, w, precision="fma", w2=w2, tile=tile), exact)
            fma = min((t for t in times if t.startswith("fma")), key=times.get)
            rows.append(row(f"fma{' glu' if glu else ''}", f"M={m} K={k} N={n} B={b}", times[fma],
                            (x.numel() + w.numel() * (2 if glu else 1) + b * m * n) * 4, ceiling,
                            extra={"best_fma": fma, "times": times, "rel_err": errors}))
            probe = f", probe16 {errors['probe16']:.1e}" if "probe16" in errors else ""
            print(rows[-1]["shape"], f"cublas {times['cublas']:.1f} tf32x3 {times['tf32x3']:.1f} best", fma,
                  f"{times[fma]:.1f} (error {errors[fma]:.1e}{probe})", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="kernels.json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="moe,mla,small,linear")
    a = ap.parse_args()
    t0 = time.perf_counter()
    build.library()
    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "build_s": build.build_seconds, "lib_s": time.perf_counter() - t0}
    only = a.only.split(",")
    ceiling = copy_ceiling() if only not in (["ncu"], ["ncuwide"]) else float("nan")  # NOTE: an ncu pass reads counters, no ceiling
    info["copy_ceiling_GBps"] = ceiling / 1e9
    print(info, flush=True)
    rows = []
    for name, fn in (("small", lambda: bench_small(ceiling)), ("moe", lambda: bench_moe(ceiling, a.quick)),
                     ("mla", lambda: bench_mla(ceiling, a.quick)), ("linear", lambda: bench_linear(ceiling)),
                     ("tiles", lambda: bench_tiles(ceiling)), ("fma", lambda: bench_fma(ceiling)),
                     ("mla_tiles", lambda: bench_mla_tiles(ceiling)), ("exact", lambda: bench_exact(ceiling, a.quick)),
                     ("exact_products", lambda: bench_exact(ceiling, a.quick, mla=False)),
                     ("exact_mla", lambda: bench_exact(ceiling, a.quick, shapes=())),
                     ("exact_tp8", lambda: bench_exact(ceiling, a.quick, EXACT_PRODUCTS_TP8, mla=False)),
                     ("exact_block_m", lambda: bench_exact_block_m(ceiling)),
                     ("cuda_mla", lambda: bench_cuda_mla(ceiling, a.quick)),
                     ("exact_merge", lambda: bench_exact_merge(ceiling)),
                     ("exact_chunk", lambda: bench_exact_chunk(ceiling)),
                     ("exact_capacity", lambda: bench_exact_capacity(ceiling)),
                     ("exact_demo", lambda: bench_exact_demo(ceiling)),
                     ("ncu", profile_once), ("ncuwide", profile_wide)):
        if name in only:
            try:
                rows += fn()
            except Exception as e:  # keep the other sections' numbers
                import traceback
                traceback.print_exc()
                rows.append({"kernel": name, "error": repr(e)})
    with open(a.json, "w") as f:
        json.dump({"info": info, "rows": rows}, f, indent=1)
    print(f"\ncopy ceiling {ceiling / 1e9:.0f} GB/s ({info['device']})")
    print(f"{'kernel':18} {'shape':28} {'us':>9} {'GB/s':>7} {'%ceil':>6} {'%floor':>6} {'torch us':>9} {'x':>6}")
    for r in rows:
        if "error" in r:
            print(f"{r['kernel']:18} ERROR {r['error'][:80]}")
            continue
        print(f"{r['kernel']:18} {r['shape']:28} {r['us']:9.1f} {r['GBps']:7.0f} {100 * r['frac_ceiling']:6.1f} "
              f"{100 * r.get('frac_floor', r['frac_ceiling']):6.1f} {r.get('torch_us', float('nan')):9.1f} "
              f"{r.get('speedup_vs_torch', float('nan')):6.1f}")


if __name__ == "__main__":
    main()
