"""The counters table BENCHMARKS.md quotes, from the CSV that `bash benchmarks/gpu_session.sh ncu` writes
(Nsight Compute's `--csv --page details`): one row per profiled kernel launch, in launch order, with its grid,
block, duration and the few counters that say whether it is bound by memory or by latency.

    python benchmarks/ncu_table.py ncu.csv [--skip elementwise]

The CSV starts with ncu's own warnings; the table starts at the header line whose first field is "ID"."""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

# (metric name in ncu's details page, column title): SpeedOfLight, Occupancy, SchedulerStats, LaunchStats sections
COLUMNS = [("Duration", "us"), ("DRAM Throughput", "DRAM %"), ("L2 Cache Throughput", "L2 %"),
           ("Achieved Occupancy", "occupancy %"), ("Theoretical Occupancy", "theor. %"),
           ("Issued Warp Per Scheduler", "issued / scheduler"), ("No Eligible", "no eligible %"),
           ("Registers Per Thread", "registers")]


def metric(cell: str) -> float | None:
    """A counter's cell as a number (ncu writes thousands separators), None where it is a word or empty ("n/a")."""
    try:
        return float(cell.replace(",", ""))
    except ValueError:
        return None


def launches(text: str) -> list[dict]:
    """Each launch's {"id", "kernel", "grid", "block", metric name: value} from the CSV's text, in ID order."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError('no "ID" header line: not an ncu --csv --page details file')
    rows = csv.reader(lines[start:])
    head = next(rows)
    col = {name: head.index(name) for name in ("ID", "Kernel Name", "Grid Size", "Block Size", "Metric Name",
                                               "Metric Unit", "Metric Value")}
    out: dict[int, dict] = {}
    for r in rows:
        if len(r) <= col["Metric Value"]:
            continue
        one = out.setdefault(int(r[col["ID"]]), {"id": int(r[col["ID"]]), "kernel": r[col["Kernel Name"]],
                                                 "grid": r[col["Grid Size"]], "block": r[col["Block Size"]]})
        value = metric(r[col["Metric Value"]])
        if value is None:  # NOTE: some metrics are words or empty (a cache's name, "n/a"): not table figures
            continue
        if r[col["Metric Name"]] == "Duration":  # NOTE: ncu picks the unit per launch; the table is in us
            value *= {"ns": 1e-3, "us": 1.0, "ms": 1e3}.get(r[col["Metric Unit"]], 1.0)
        one[r[col["Metric Name"]]] = value
    return [out[k] for k in sorted(out)]


def table(runs: list[dict], skip: tuple[str, ...] = ()) -> str:
    """A markdown table of the launches whose kernel name holds none of `skip`."""
    lines = ["| id | kernel | grid | block | " + " | ".join(t for _, t in COLUMNS) + " |",
             "|---|---|---|---|" + "---:|" * len(COLUMNS)]
    for r in runs:
        if any(s in r["kernel"] for s in skip):
            continue
        cells = [f"{r[m]:.2f}" if m in r else "" for m, _ in COLUMNS]
        lines.append(f"| {r['id']} | {r['kernel'][:40]} | {r['grid']} | {r['block']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--skip", nargs="*", default=["elementwise"], help="leave out kernels whose name holds these")
    a = ap.parse_args(argv)
    try:
        print(table(launches(a.csv.read_text(errors="replace")), tuple(a.skip)))
    except (OSError, ValueError) as e:
        print(f"ncu_table: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
