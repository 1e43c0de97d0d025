"""Peak host memory while loading a checkpoint (VmHWM), per rank for TP > 1, and the cost of the collective
layer at TP=1.

    python -m ddtree_chat.engine.synthetic --out /tmp/small --preset small
    python benchmarks/load_memory.py /tmp/small/target [--dtype float32|bfloat16] [--tp 1 2]

Each measurement runs in a fresh process so peaks do not add up."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def _vm(pid="self", key="VmHWM") -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))


def _model_bytes(model) -> int:
    """What rank 0's target keeps: parameters, buffers and the routed experts (not module parameters)."""
    n = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    for layer in model.layers:
        ex = getattr(layer.mlp, "experts", None)
        for w in (ex.gate, ex.up, ex.down) if ex is not None else ():
            parts = (w,) if hasattr(w, "numel") else (w.packed, w.scale)
            n += sum(p.numel() * p.element_size() for p in parts)
    return n


def _measure(model: str, dtype: str, tp: int) -> dict:
    import timeit

    import torch

    from ddtree_chat.engine import Engine

    base = _vm()
    eng = Engine.load(model, None, device="cpu", tp=tp, dtype=getattr(torch, dtype))
    out = {"tp": tp, "dtype": dtype, "baseline_bytes": base, "rank_peak_bytes": [_vm()],
           "rank0_final_bytes": _vm(key="VmRSS"), "rank0_model_bytes": _model_bytes(eng.target)}
    if eng.workers:
        out["rank_peak_bytes"] += [_vm(p.pid) for p in eng.workers.procs]
    x = torch.zeros(4, eng.tcfg.hidden_size)
    out["all_reduce_ns"] = timeit.timeit(lambda: eng.tp.all_reduce(x), number=20000) / 20000 * 1e9 if tp == 1 else None
    eng.close()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child is not None:
        print(json.dumps(_measure(a.model, a.dtype, a.child)))
        return 0
    for tp in a.tp:
        r = subprocess.run([sys.executable, __file__, a.model, "--dtype", a.dtype, "--child", str(tp)],
                           capture_output=True, text=True, check=True)
        m = json.loads(r.stdout.strip().splitlines()[-1])
        peaks = ", ".join(f"rank {i}: {b / 1e9:.2f} GB" for i, b in enumerate(m["rank_peak_bytes"]))
        extra = f"; all_reduce at TP=1: {m['all_reduce_ns']:.0f} ns/call" if m["all_reduce_ns"] else ""
        print(f"TP={tp} {a.dtype}: baseline {m['baseline_bytes'] / 1e9:.2f} GB, rank 0 model "
              f"{m['rank0_model_bytes'] / 1e9:.2f} GB, rank 0 final RSS {m['rank0_final_bytes'] / 1e9:.2f} GB, "
              f"peak {peaks}{extra}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
