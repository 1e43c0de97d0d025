"""CPU CI: every CUDA source compiles for sm_90a and sm_120a (compile only, no GPU needed)."""

import subprocess

import pytest

from ddtree_chat.engine.ops import build

SOURCES = build.sources()
NVCC = build.find_nvcc()


def test_sources_exist():
    assert SOURCES, "ddtree_chat/csrc has no .cu sources"


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["90a", "120a"])
@pytest.mark.parametrize("src", SOURCES, ids=[p.name for p in SOURCES])
def test_compiles(src, arch, tmp_path):
    cmd = [NVCC, "-O3", "-std=c++17", "--expt-relaxed-constexpr", "-c", str(src), "-o", str(tmp_path / "k.o"),
           "-gencode", f"arch=compute_{arch},code=sm_{arch}"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "warning" not in res.stderr.lower(), res.stderr[-4000:]


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_shared_library_links(tmp_path):
    """The exact command the JIT build uses (both archs + PTX) links into one .so."""
    res = subprocess.run(build.nvcc_command(NVCC, SOURCES, tmp_path / "lib.so"), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-4000:]
