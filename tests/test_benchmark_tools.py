"""The benchmark scripts' own logic on CPU (their figures come from the GPU runs in BENCHMARKS.md)."""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import e2e  # noqa: E402
import k26_round  # noqa: E402


def test_covered_counts_overlapping_kernels_once_and_clips_to_the_window():
    assert e2e.covered([], 0, 10) == 0
    assert e2e.covered([(1, 3), (2, 5), (7, 8)], 0, 10) == 5  # [1, 5] + [7, 8]
    assert e2e.covered([(-5, 2), (9, 20)], 0, 10) == 3  # clipped to [0, 2] and [9, 10]
    assert e2e.covered([(1, 9), (2, 3)], 0, 10) == 8  # nested


def test_k26_round_benchmark_runs_scaled_down_on_cpu(tmp_path):
    """benchmarks/k26_round.py end to end at tiny dims, uncaptured: every program of every round timed,
    with the bytes it must read (the real run is on the GPU)."""
    out = tmp_path / "round.json"
    assert k26_round.main(["--tiny", "--device", "cpu", "--context", "40", "--budgets", "4", "--reps", "1",
                           "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["mode"] for r in rows] == ["ar"] * 2 + ["dflash 7"] * 3 + ["ddtree 4"] * 3
    assert all(r["ms"] > 0 and r["bytes"] > 0 for r in rows)


def test_gpu_session_script_logs_steps_and_round_trips_its_cache(tmp_path):
    """benchmarks/gpu_session.sh (run on the GPU machine): an unknown step is logged, not fatal, and the
    cache folder comes back as archive parts that restore it."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    out, cache = tmp_path / "out", tmp_path / "cache"
    out.mkdir()
    (cache / "triton").mkdir(parents=True)
    (cache / "triton" / "kernel.cubin").write_bytes(b"\x01" * 1000)
    env = dict(os.environ, OUT=str(out), CACHE_ROOT=str(cache))
    subprocess.run(["bash", str(root / "benchmarks" / "gpu_session.sh"), "nosuchstep"], cwd=tmp_path, env=env,
                   check=True, timeout=60)
    assert "unknown step nosuchstep" in (out / "log.txt").read_text()
    parts = sorted(out.glob("cache.tgz.part-*"))
    assert parts
    restored = tmp_path / "restored"
    restored.mkdir()
    subprocess.run(f"cat {' '.join(map(str, parts))} | tar xzf - -C {restored}", shell=True, check=True)
    assert (restored / "triton" / "kernel.cubin").read_bytes() == b"\x01" * 1000
