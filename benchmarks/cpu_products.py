"""Why a tree's verify costs more than one AR step on the CPU: the time of each weight product of the shipped
demo target at the row counts rounds use (one AR token, a 9 / 17 / 33-node tree), one thread, float32 (the CPU
default) and bf16, against the same product's one-row time.

    PYTHONPATH=. python benchmarks/cpu_products.py [--rows 1 9 17 33] [--repeats 200] [--packed] [--json OUT]

A product that reads its weights at one row and is done (memory-bound) costs about the same at 9 rows; one whose
arithmetic already sets the pace at one row costs up to 9x. Each shape is weighted by how many times one forward
runs it; the routed experts by the distinct experts M tokens pick (expected, uniform routing), each over its share
of the rows (with --packed from ops/moe.py's DENSE_ROWS rows on: every expert on all M rows, three products over
the stacked experts, as the engine's CPU runs them); the last line is a forward's products at M rows over their cost at one row (attention, norms and
the host's per-op work are not in it). x [M, K] @ w [N, K]^T as F.linear runs it (--packed: through the weight's
packed form, ops/cpu_packed.py, as a loaded CPU engine runs it), random values, median of --repeats calls."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def product_us(n: int, k: int, m: int, dtype: torch.dtype, repeats: int, packed: bool = False) -> float:
    """Median microseconds of F.linear(x [m, k], w [n, k]) in dtype, or of its packed form (w touched once first:
    warm, as in a forward whose weights were read the step before is not; the point is the arithmetic's share)."""
    from ddtree_chat.engine.ops import cpu_packed

    g = torch.Generator().manual_seed(n * 7919 + k)
    w, x = torch.randn(n, k, generator=g).to(dtype), torch.randn(m, k, generator=g).to(dtype)
    if packed:
        cpu_packed.mark_tensor(w)
    fn = cpu_packed.linear if packed else F.linear
    for _ in range(5):
        fn(x, w)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(x, w)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def dense_shapes(model) -> dict[tuple[int, int], int]:
    """Each 2-D weight shape of the target but the routed experts' -> how many products of it one forward runs (the
    embedding is a lookup; kv_b_proj counts as one product: the absorbed form applies it per head, in two halves)."""
    counts: dict[tuple[int, int], int] = {}
    for name, t in model.state_dict().items():
        if t.dim() == 2 and "embed" not in name:
            counts[tuple(t.shape)] = counts.get(tuple(t.shape), 0) + 1
    return counts


def expert_us(cfg, moe_layers: int, m: int, us, dense: bool = False) -> float:
    """A forward's routed-expert products at m rows: the distinct experts m tokens pick (expected, uniform routing)
    each run gate, up and down over their share of the rows (rounded up); dense: every expert on every row as the
    engine's CPU runs it from ops/moe.py's DENSE_ROWS rows on (gate and up [E * I, H], down [H, E * I], m rows
    each); us(n, k, rows) times one product."""
    e, k, h, i = cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.hidden_size, cfg.moe_intermediate_size
    if dense:
        return moe_layers * (2 * us(e * i, h, m) + us(h, e * i, m))
    distinct = e * (1 - (1 - k / e) ** m)
    rows = -(-m * k // round(distinct))
    return moe_layers * distinct * (2 * us(i, h, rows) + us(h, i, rows))


def main(argv=None) -> int:
    from ddtree_chat.engine.default_model import shipped_demo_dirs
    from ddtree_chat.engine.loader import load_target
    from ddtree_chat.engine.ops import moe

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 9, 17, 33])
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--packed", action="store_true", help="each product through its packed form (ops/cpu_packed.py)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = sorted(set(a.rows) | {1})
    cfg, model = load_target(shipped_demo_dirs()[0], torch.device("cpu"), torch.float32)
    shapes = dense_shapes(model)
    moe_layers = sum(1 for name in model.state_dict() if name.endswith("mlp.gate.weight"))
    print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, one thread, "
          f"{'packed' if a.packed else 'F.linear'}; us (x one-row time)")
    print("| dtype | product [N, K] | per forward | " + " | ".join(f"M={m}" for m in rows) + " |")
    print("|---|---|---:|" + "---:|" * len(rows))
    res: dict = {"rows": rows, "products": {}, "experts_us": {}, "forward_us": {}}
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        timed: dict[tuple[int, int, int], float] = {}

        def us(n, k, m):  # noqa: E306 - one timing per (shape, rows), shared by the dense and the expert lines
            if (n, k, m) not in timed:
                timed[n, k, m] = product_us(n, k, m, dtype, a.repeats, a.packed)
            return timed[n, k, m]

        total = dict.fromkeys(rows, 0.0)
        for (n, k), count in sorted(shapes.items()):
            for m in rows:
                total[m] += count * us(n, k, m)
            res["products"][f"{name} {n}x{k}"] = {"per_forward": count, **{str(m): us(n, k, m) for m in rows}}
            cells = " | ".join(f"{us(n, k, m):.1f} ({us(n, k, m) / us(n, k, 1):.1f}x)" for m in rows)
            print(f"| {name} | {n} x {k} | {count} | {cells} |")
        experts = {m: expert_us(cfg, moe_layers, m, us, a.packed and m >= moe.DENSE_ROWS) for m in rows}
        res["experts_us"][name] = {str(m): experts[m] for m in rows}
        cells = " | ".join(f"{experts[m]:.0f} ({experts[m] / experts[1]:.2f}x)" for m in rows)
        how = "; dense from DENSE_ROWS rows" if a.packed else ""
        print(f"| {name} | routed experts (expected distinct, gate + up + down{how}) | {moe_layers} layers | {cells} |")
        for m in rows:
            total[m] += experts[m]
        res["forward_us"][name] = {str(m): total[m] for m in rows}
        cells = " | ".join(f"{total[m]:.0f} ({total[m] / total[1]:.2f}x)" for m in rows)
        print(f"| {name} | **a forward's products** | | {cells} |")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
