"""benchmarks/gpu_session.sh's `alone` step: every GPU test file in a process of its own, the longest file
(test_kernels_gpu) as two interleaved halves whose tests together are the file's, the TP file last and alone, the
multi-GPU file left to its own step
(python stubbed: it records the pytest calls, and lists fake test ids when asked to collect)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IDS = [f"tests/test_kernels_gpu.py::test_k[{i}]" for i in range(7)]


def _alone(tmp_path: Path, collect: bool = True, files: str | None = None) -> list[list[str]]:
    stub = tmp_path / "bin"
    stub.mkdir()
    calls = tmp_path / "calls.txt"
    listing = "".join(f"echo '{i}'\n" for i in IDS) + "echo\necho '7 tests collected'\n" if collect else "exit 4\n"
    (stub / "python").write_text(
        "#!/bin/bash\n"
        'case "$*" in\n'
        f'  *--collect-only*) {listing.replace(chr(10), "; ")};;\n'
        '  "-c "*) ;;\n'  # the CUDA library's build (fresh_home)
        f'  *) echo "$*" >> {calls} ;;\n'
        "esac\n")
    (stub / "python").chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, OUT=str(out), PATH=f"{stub}:{os.environ['PATH']}", CACHE_ROOT=str(tmp_path / "cache"))
    env.pop("ALONE_SPLIT", None)
    env.pop("ALONE_FILES", None)
    if files is not None:
        env["ALONE_FILES"] = files
    subprocess.run(["bash", "benchmarks/gpu_session.sh", "alone"], cwd=ROOT, env=env, check=True, timeout=120)
    return [line.split() for line in calls.read_text().splitlines()]


def test_alone_splits_the_kernel_tests_in_two_halves_and_runs_tp_last(tmp_path):
    calls = _alone(tmp_path)
    mark = "mark" ".gpu"  # NOTE: split, or the script's grep would take this file for a GPU test file
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py") if mark in p.read_text())
    assert calls[-1][-1] == "tests/test_tp_gpu.py"  # after the others' wait
    kernels = [c for c in calls if any("test_kernels_gpu" in a for a in c)]
    assert len(kernels) == 2
    halves = [[a for a in c if a.startswith("tests/")] for c in kernels]
    assert sorted(halves[0] + halves[1]) == sorted(IDS) and not set(halves[0]) & set(halves[1])
    assert all(len(h) in (3, 4) for h in halves)
    whole = sorted(c[-1] for c in calls[:-1] if c not in kernels)
    # NOTE: the multi-GPU file is its own step (`multigpu`): its ranks would contend with the files beside them
    assert whole == sorted(f for f in files if f not in ("tests/test_kernels_gpu.py", "tests/test_tp_gpu.py",
                                                        "tests/test_multigpu.py"))
    assert all(c[:5] == ["-m", "pytest", "-q", "-m", "gpu"] for c in calls)


def test_a_failed_collection_runs_the_file_whole_once_never_a_bare_pytest(tmp_path):
    calls = _alone(tmp_path, collect=False)
    kernels = [c for c in calls if any("test_kernels_gpu" in a for a in c)]
    assert kernels == [["-m", "pytest", "-q", "-m", "gpu", "--timeout", "300", "tests/test_kernels_gpu.py"]]
    assert all(c[-1].startswith("tests/") for c in calls)


def test_alone_files_narrows_the_run_to_those_files_then_tp(tmp_path):
    """ALONE_FILES: only the files named (the kernel file still in halves), then the TP file."""
    calls = _alone(tmp_path, files="tests/test_graphs.py tests/test_kernels_gpu.py")
    assert calls[-1][-1] == "tests/test_tp_gpu.py"
    named = {a.split("::")[0] for c in calls[:-1] for a in c if a.startswith("tests/")}
    assert named == {"tests/test_graphs.py", "tests/test_kernels_gpu.py"}
    assert sum(any("test_kernels_gpu" in a for a in c) for c in calls) == 2
