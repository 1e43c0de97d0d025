"""Where one profiled launch's warps wait, instruction by instruction, from Nsight Compute's source page
(`ncu --import REPORT --page source --print-source sass --csv`, what `bash benchmarks/gpu_session.sh ncuwide`
writes to ncu_wide_sass.csv): the SASS lines with the most sampled warp stalls, each line's share of all
samples, and the instruction.

    python benchmarks/ncu_sass.py ncu_wide_sass.csv [--top 30]

The CSV may start with ncu's own lines; the table starts at the header line that names a "Source" column."""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from ncu_table import metric

ALL, NOT_ISSUED = "Warp Stall Sampling (All", "Warp Stall Sampling (Not-issued"


def _number(cell: str) -> int:
    return int(metric(cell) or 0)  # NOTE: a word or empty cell ("n/a") counts no samples


def sampled_lines(text: str) -> list[dict]:
    """Each SASS line's {"address", "source", "samples", "not_issued"}, in the page's order."""
    rows = list(csv.reader(text.splitlines()))
    start = next((i for i, r in enumerate(rows) if "Source" in r), None)
    if start is None:
        raise ValueError('no header line with a "Source" column: not an ncu --page source --csv file')
    head = rows[start]
    samples, not_issued = (next((i for i, h in enumerate(head) if h.startswith(p)), None) for p in (ALL, NOT_ISSUED))
    if samples is None:
        raise ValueError(f'no "{ALL} Samples)" column: the report holds no SourceCounters section')
    addr = next((i for i, h in enumerate(head) if "Address" in h), None)
    src = head.index("Source")
    out = []
    for r in rows[start + 1:]:
        if len(r) <= max(src, samples):
            continue
        out.append({"address": r[addr] if addr is not None else "", "source": r[src].strip(),
                    "samples": _number(r[samples]),
                    "not_issued": _number(r[not_issued]) if not_issued is not None else None})
    return out


def table(lines: list[dict], top: int = 30) -> str:
    """A markdown table of the `top` lines with the most samples, with their share of the launch's samples."""
    total = sum(x["samples"] for x in lines) or 1
    out = [f"{total} warp samples over {len(lines)} SASS lines; the {top} most sampled:",
           "| address | samples | % of all | not issued | instruction |", "|---|---:|---:|---:|---|"]
    for x in sorted(lines, key=lambda x: -x["samples"])[:top]:
        ni = "" if x["not_issued"] is None else str(x["not_issued"])
        out.append(f"| {x['address']} | {x['samples']} | {100 * x['samples'] / total:.1f} | {ni} | "
                   f"`{x['source'][:80]}` |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    try:
        print(table(sampled_lines(args.csv.read_text(errors="replace")), args.top))
    except (OSError, ValueError) as e:
        sys.exit(f"ncu_sass: {args.csv}: {e}")


if __name__ == "__main__":
    main()
