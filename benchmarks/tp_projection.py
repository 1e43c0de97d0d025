"""Single-stream tokens/s of ar, dflash and ddtree for K2.6 on 8x RTX PRO 6000, projected from rank 0's measured
per-forward times (k26_forward.py --tp-world 8 --json) with every assumption an argument:

    python benchmarks/tp_projection.py tp8_rank0.json [--round tp8_round.json] [--json OUT]

- a rank's GPU time scales with bandwidth: the measured copy ceiling is the same share of the H200's spec
  (--spec-gbps) as the target GPU's copy ceiling of its spec (--target-gbps);
- --allreduce-us: the all-reduce time per forward row count (122 all-reduces a forward, 2 a layer);
- --draft-ms: one draft on the H200 unsplit (scaled like the forwards); at the bound the drafter is split
  over the ranks (1/world of it plus 2 all-reduces a drafter layer); --round (k26_round.py --tp-world N
  --collective-us 0 --json): today's draft is rank 0's measured draft program instead (scaled, plus those
  all-reduces);
- --tau: accepted tokens per round (low and high), the same for dflash and ddtree (a floor for ddtree);
- "at bound": each forward at --bound-factor times its bytes bound."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROUNDS = (("ar", 1), ("dflash (8 rows)", 8), ("ddtree 16 (17 rows)", 17))  # mode, verified rows


def rank_drafts(round_data: dict) -> dict[str, float]:
    """Rank 0's draft program ms by projected mode, from k26_round.py --tp-world N --json."""
    names = {"dflash": "dflash (8 rows)", "ddtree 16": "ddtree 16 (17 rows)"}  # NOTE: dflash's mode names its block
    out = {}
    for r in round_data["rows"]:
        key = "dflash" if r["mode"].startswith("dflash") else r["mode"]
        if key in names and r["program"].startswith("DraftKey"):
            out[names[key]] = r["ms"]
    return out


def project(data: dict, spec_gbps: float, target_gbps: float, allreduce_us: dict[int, float], draft_ms: float,
            draft_layers: int, tau: tuple[float, float], bound_factor: float, layers: int = 61,
            rank_draft_ms: dict[str, float] | None = None) -> list[dict]:
    """One row per (context, mode, today / at bound): forward, all-reduce, draft and round ms, tokens/s.
    rank_draft_ms: rank 0's measured draft ms by mode (today's drafts then: split, scaled, plus all-reduces)."""
    scale = spec_gbps / target_gbps  # NOTE: equal shares of spec cancel the measured ceiling out
    world = data["tp_world"]
    by = {(r["context"], r["tokens"]): r for r in data["rows"] if r["collective_us"] == 0}
    out = []
    for ctx in sorted({c for c, _ in by}):
        for mode, t in ROUNDS:
            r = by[(ctx, t)]
            for when, fwd_ms in (("today", r["graph_ms"] or r["eager_ms"]), ("at bound", bound_factor * r["bound_ms"])):
                fwd = fwd_ms * scale
                coll = 2 * layers * allreduce_us[t] / 1e3
                split_coll = 2 * draft_layers * allreduce_us[1] / 1e3  # a split drafter's all-reduces
                if t == 1:
                    draft = 0.0
                elif when == "at bound":
                    draft = draft_ms * scale / world + split_coll
                elif rank_draft_ms:  # today, measured on a rank of the split drafter
                    draft = rank_draft_ms[mode] * scale + split_coll
                else:  # today, the unsplit drafter
                    draft = draft_ms * scale
                round_ms = fwd + coll + draft
                per = (1.0, 1.0) if t == 1 else tau
                out.append({"context": ctx, "mode": mode, "when": when, "forward_ms": fwd, "allreduce_ms": coll,
                            "draft_ms": draft, "round_ms": round_ms,
                            "tok_s": [p * 1e3 / round_ms for p in per]})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("measured", type=Path, help="k26_forward.py --tp-world N --json output")
    ap.add_argument("--spec-gbps", type=float, default=4800.0, help="the measuring GPU's spec bandwidth (H200)")
    ap.add_argument("--target-gbps", type=float, default=1790.0, help="the target GPU's (RTX PRO 6000)")
    ap.add_argument("--allreduce-us", default="1:10,8:30,17:40", help="rows:us pairs (published PCIe figures)")
    ap.add_argument("--draft-ms", type=float, default=2.5)
    ap.add_argument("--draft-layers", type=int, default=6)
    ap.add_argument("--tau", type=float, nargs=2, default=(3.7, 5.3))
    ap.add_argument("--bound-factor", type=float, default=1.25)
    ap.add_argument("--round", type=Path, default=None, help="k26_round.py --tp-world N --json output: measured drafts")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    data = json.loads(a.measured.read_text())
    allreduce = {int(k): float(v) for k, v in (p.split(":") for p in a.allreduce_us.split(","))}
    drafts = rank_drafts(json.loads(a.round.read_text())) if a.round else None
    rows = project(data, a.spec_gbps, a.target_gbps, allreduce, a.draft_ms, a.draft_layers, tuple(a.tau),
                   a.bound_factor, data["layers"], drafts)
    print(f"x{a.spec_gbps / a.target_gbps:.2f} bandwidth scaling; tau {a.tau[0]}-{a.tau[1]}")
    print("| context | mode | when | forward | all-reduces | draft | round | tokens/s |")
    print("|---:|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        tok = "-".join(f"{v:.0f}" for v in dict.fromkeys(r["tok_s"]))
        print(f"| {r['context']} | {r['mode']} | {r['when']} | {r['forward_ms']:.1f} | {r['allreduce_ms']:.1f} | "
              f"{r['draft_ms']:.1f} | {r['round_ms']:.1f} | {tok} |")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
