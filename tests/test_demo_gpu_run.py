"""ddtree_chat/dev/demo/gpu_run.sh's sweep: each target's fields reach train.py's flags (python3 stubbed)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_sweep_fields_become_train_flags(tmp_path):
    stub = tmp_path / "bin"
    stub.mkdir()
    calls = tmp_path / "calls.txt"
    (stub / "python3").write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    (stub / "python3").chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, OUT=str(out), PATH=f"{stub}:{os.environ['PATH']}",
               TARGETS="8:4:20:hidden=384:mixed:everyday+self:0.3 2:1:10")
    subprocess.run(["bash", "ddtree_chat/dev/demo/gpu_run.sh", "sweep"], cwd=ROOT, env=env, check=True, timeout=60)
    trains = sorted(line for line in calls.read_text().splitlines() if "demo.train" in line)
    assert len(trains) == 2
    full, bare = (t.split() for t in sorted(trains, key=len, reverse=True))
    assert full[full.index("--qat-frac") + 1] == "0.3" and full[full.index("--target-arch") + 1] == "hidden=384"
    assert full[full.index("--rename-pool") + 1] == "mixed" and "/tmp/self" in full and "/tmp/everyday" in full
    assert full[full.index("--target-steps") + 1] == "20" and full[full.index("--renames") + 1] == "8"
    assert "--qat-frac" not in bare and "--target-arch" not in bare and "--rename-pool" not in bare
    assert bare[bare.index("--target-steps") + 1] == "10"
