"""What torch's CPU build does to a row's bits, which ops/cpu_exact.py's row-invariant forms are built on
(docs/exactness.md, "On the CPU"), and what those forms cost: on this machine's torch build, which row counts give
a row of a float32 product (and of the same product in bf16) the bits it gets alone, whether attention's rows
(plain and chunked) and the elementwise ops the target uses keep their bits inside larger launches, and the AR
round with the forms on and off.

    PYTHONPATH=. python benchmarks/cpu_rows.py [--steps 300] [--json OUT]

Products: every weight shape of the shipped demo target (x [M, K] @ w^T, as F.linear runs it; random values),
M = 1..64, one thread. "alone up to": the largest M whose first row still has the one-row product's bits; "agree
from": the smallest M0 such that every M >= M0 gives its first row the M0-row launch's bits and its last row the
bits that row gets placed first. Attention: ops.mla_attention_ref with DDTREE_CPU_EXACT=0 (the plain form) and on (the
chunked form), a chain node inside a 9-row launch vs the one-row step at its position (random latents, prefixes of
5..300 keys). Elementwise: one row alone vs the same row first in a 9-row launch, at the width the target applies
the op to (a launch's last elements may take a scalar path). Cost: the decoder's AR rounds on the first held-out
prompt, DDTREE_CPU_EXACT on and off alternated round by round in one process."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def product_rows(n: int, k: int, most: int = 64) -> tuple[int, int]:
    """(alone up to, agree from) for x [M, k] @ w [n, k]^T, M = 1..most (agree from most + 1: none agree)."""
    g = torch.Generator().manual_seed(n * 7919 + k)
    w, x = torch.randn(n, k, generator=g), torch.randn(most, k, generator=g)
    counts = range(1, most + 1)
    first = {m: F.linear(x[:m], w)[0] for m in counts}
    # the last row of an m-row launch has the bits it gets placed first in one
    placed = {m: torch.equal(F.linear(x[:m], w)[m - 1], F.linear(x[:m].roll(1, 0), w)[0]) for m in counts}
    alone = max(m for m in counts if all(torch.equal(first[j], first[1]) for j in range(1, m + 1)))
    agree = min((m0 for m0 in counts if all(placed[m] and torch.equal(first[m], first[m0]) for m in range(m0, most + 1))),
                default=most + 1)
    return alone, agree


def every_row_alone(n: int, k: int, dtype: torch.dtype, most: int = 64) -> int:
    """The largest M (of 1..most) up to which every launch gives each of its rows the bits that row gets alone."""
    g = torch.Generator().manual_seed(n * 7919 + k)
    w, x = torch.randn(n, k, generator=g).to(dtype), torch.randn(most, k, generator=g).to(dtype)
    alone = torch.cat([F.linear(x[i : i + 1], w) for i in range(most)])
    return next((m - 1 for m in range(1, most + 1) if not torch.equal(F.linear(x[:m], w), alone[:m])), most)


def attention_rows(exact: bool, trials: int = 30) -> tuple[int, int]:
    """(rows differing, rows compared): a chain node inside a 9-row launch vs the one-row step; exact: the
    chunked form (DDTREE_CPU_EXACT on), else the plain one."""
    from ddtree_chat.engine.ops.mla_attention import mla_attention_ref

    g = torch.Generator().manual_seed(0)
    h, r, p, t = 4, 64, 16, 9
    bad = total = 0
    os.environ["DDTREE_CPU_EXACT"] = "1" if exact else "0"
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    one = torch.ones(1, 1, dtype=torch.bool)
    for _ in range(trials):
        pre = int(torch.randint(5, 300, (), generator=g))
        ckv, kpe = torch.randn(pre + t, r, generator=g), torch.randn(pre + t, p, generator=g)
        q, qp = torch.randn(t, h, r, generator=g), torch.randn(t, h, p, generator=g)
        full = mla_attention_ref(q, qp, ckv, kpe, pre, causal, 0.1)
        for j in range(t):
            step = mla_attention_ref(q[j : j + 1], qp[j : j + 1], ckv[: pre + j + 1], kpe[: pre + j + 1], pre + j, one, 0.1)
            bad += not torch.equal(step[0], full[j])
            total += 1
    return bad, total


def elementwise_rows(widths: dict[str, int], trials: int = 2000) -> dict[str, int]:
    """Rows that differ alone vs first in a 9-row launch, of `trials`, per op at the target's width for it."""
    g = torch.Generator().manual_seed(0)
    out = {}
    for name, width in widths.items():
        fn = {"sigmoid": torch.sigmoid, "silu": F.silu, "exp": torch.exp}[name.split()[0]]
        bad = 0
        for _ in range(trials):
            x = torch.randn(9, width, generator=g) * 4
            bad += not torch.equal(fn(x[:1].clone()), fn(x)[:1])
        out[f"{name} [T, {width}]"] = bad
    return out


def exact_step_cost(steps: int) -> tuple[float, float]:
    """ms per AR round with the row-invariant CPU forms off and on (DDTREE_CPU_EXACT, read per call)."""
    from ddtree_chat.dev.demo.common import heldout_prompts
    from ddtree_chat.engine import Engine
    from ddtree_chat.engine.default_model import shipped_demo_dirs
    from ddtree_chat.modes import Mode

    eng = Engine.load(*shipped_demo_dirs(), device="cpu", graphs=False)
    dec = eng.decoder
    dec.pending = int(dec.prefill(heldout_prompts(1)[0]["prompt_ids"], drafting=False).argmax())
    took = {False: 0.0, True: 0.0}
    for i in range(2 * steps):
        exact = bool(i % 2)
        os.environ["DDTREE_CPU_EXACT"] = "1" if exact else "0"
        t0 = time.perf_counter()
        dec.round(Mode.AR, 0, 0.0, 1.0, 0, frozenset(), 2)
        took[exact] += time.perf_counter() - t0
    return 1e3 * took[False] / steps, 1e3 * took[True] / steps


def main(argv=None) -> int:
    from ddtree_chat.engine.default_model import shipped_demo_dirs
    from ddtree_chat.engine.loader import load_target

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, one thread")
    cfg, model = load_target(shipped_demo_dirs()[0], torch.device("cpu"), torch.float32)
    shapes = {tuple(t.shape) for t in model.state_dict().values() if t.dim() == 2 and t.shape[1] >= 16}
    shapes |= {(cfg.moe_intermediate_size, cfg.hidden_size), (cfg.hidden_size, cfg.moe_intermediate_size)}
    res = {"products": {}, "every_row_alone": {}, "attention": None, "elementwise": None, "ar_ms": None}
    print("| product [N, K] | one-row bits kept up to M | all launches agree from M | every row alone up to M, "
          "float32 / bf16 |\n|---|---:|---:|---:|")
    for n, k in sorted(shapes):
        alone, agree = product_rows(n, k)
        res["products"][f"{n}x{k}"] = [alone, agree]
        # NOTE: bf16 beside it: a CPU with bf16 units (AMX) may keep every row's bits over more rows
        res["every_row_alone"][f"{n}x{k}"] = every = [every_row_alone(n, k, dt) for dt in (torch.float32, torch.bfloat16)]
        print(f"| {n} x {k} | {alone} | {agree} | {every[0]} / {every[1]} |")
    res["attention"] = {"plain": attention_rows(False), "chunked": attention_rows(True)}
    for form, (bad, total) in res["attention"].items():
        print(f"attention, {form} form: {bad} of {total} chain rows differ from the one-row step")
    res["elementwise"] = elementwise_rows({"sigmoid (router)": cfg.n_routed_experts,
                                           "silu (experts)": cfg.moe_intermediate_size,
                                           "silu (dense MLP)": cfg.intermediate_size, "exp": 16})
    print(f"elementwise, rows differing alone vs first of 9 (of 2000): {res['elementwise']}")
    plain, exact = exact_step_cost(a.steps)
    res["ar_ms"] = {"plain": plain, "exact": exact}
    print(f"AR round: {plain:.3f} ms plain, {exact:.3f} ms row-invariant ({exact / plain:.2f}x)")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
