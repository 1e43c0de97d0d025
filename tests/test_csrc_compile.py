"""CPU CI: every CUDA source compiles for sm_90a and sm_120a (compile only, no GPU needed), and each kernel's
compiled resource use fits an sm_120 block (the RTX PRO 6000 Blackwell cannot run here: ptxas's report of
the compiled code is the evidence). nvcc: the system's (build.find_nvcc), else the nvidia-cuda-nvcc wheel the
`test` extra installs."""

import os
import re
import subprocess
from pathlib import Path

import pytest

from ddtree_chat.engine.ops import build

SOURCES = build.sources()
SM120_SMEM = 99 * 1024  # shared memory one block may hold on sm_120
# NOTE: tiles only the benchmark sweep's MoE variants use (never ops/cuda_moe.default_variant's 10, 14, 16, 18)
# spill a few bytes: gate/up at 8 k-steps per stage (sm_120a), the one-row-tile down GEMM bounds-checked (sm_90a)
# NOTE: 7 x 4's bounds-checked form (8 B on sm_90a) is never launched: the rule takes it only where 28 divides KT
MAY_SPILL = {("moe_gemm_kernel", "1", "4", "8"), ("moe_gemm_kernel", "1", "2", "8"), ("moe_gemm_kernel", "0", "2", "4"),
             ("moe_gemm_kernel", "0", "4", "4"), ("moe_gemm_kernel", "1", "7", "4")}


def _wheel_nvcc() -> str | None:
    """The nvcc of the nvidia-cuda-nvcc wheel (nvidia/cu13/bin), or None."""
    try:
        import nvidia
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", []):
        cand = Path(root) / "cu13" / "bin" / "nvcc"
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return None


NVCC = build.find_nvcc() or _wheel_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not installed (pip install -e '.[test]' brings one)")


def run_nvcc(cmd: list[str]) -> subprocess.CompletedProcess:
    return build.run_nvcc(NVCC, cmd)


def test_sources_exist():
    assert SOURCES, "ddtree_chat/csrc has no .cu sources"


def test_the_default_build_has_the_variants_the_dispatcher_picks():
    """moe_int4.cu's picked() (what the default build instantiates) and cuda_moe.PICKED (what the dispatcher
    returns) name the same variants: they are written in two languages."""
    from ddtree_chat.engine.ops import cuda_moe

    src = (Path(build.__file__).parents[2] / "csrc" / "moe_int4.cu").read_text()
    body = re.search(r"constexpr bool picked\(int i\) \{ return ([^;]*); \}", src)
    assert body, "picked() not found in moe_int4.cu"
    assert tuple(sorted(int(v) for v in re.findall(r"i == (\d+)", body[1]))) == cuda_moe.PICKED


# every source as the engine builds it, and the MoE source as the benchmark sweep builds it (every variant)
BUILDS = [(src, []) for src in SOURCES] + [(src, ["-DDDT_MOE_SWEEP"]) for src in SOURCES if src.name == "moe_int4.cu"]


def _ptxas_report(src: Path, arch: str, defines: list[str], out: Path) -> str:
    res = run_nvcc([NVCC, "-O3", "-std=c++17", "--expt-relaxed-constexpr", *defines, "-c", str(src), "-o", str(out),
                    "-gencode", f"arch=compute_{arch},code=sm_{arch}", "-Xptxas", "-v"])
    assert res.returncode == 0, res.stderr[-4000:]
    assert "warning" not in res.stderr.lower(), res.stderr[-4000:]
    return res.stderr


@needs_nvcc
@pytest.mark.parametrize("arch", ["90a", "120a"])
@pytest.mark.parametrize("src,defines", BUILDS, ids=[p.name + "".join(d) for p, d in BUILDS])
def test_compiles_within_an_sm120_block(src, defines, arch, tmp_path):
    """Warning-free, no serialised wgmma; per kernel (ptxas -v): no spills, no stack frame, <= 99 KB of static shared
    memory. Without DDT_MOE_SWEEP the MoE source builds only the GEMMs of the variants the engine picks: 8 tiles (a TP
    rank's short-K down and few-row-tile gate/up tiles included) x (bounds checked or not) = 16; the sweep: 32."""
    report = _ptxas_report(src, arch, defines, tmp_path / "k.o")
    # ptxas serialises warpgroup MMAs it cannot pipeline (a register copy or a divergent path inside a chain) and says
    # so only as an info line: each wgmma would then wait for the one before
    assert "Potential Performance Loss" not in report, [l for l in report.splitlines() if "Performance Loss" in l]
    if src.name == "moe_int4.cu":
        gemms = {line for line in report.splitlines() if "Compiling entry function" in line and "moe_gemm_kernel" in line}
        assert len(gemms) == (32 if defines else 16), sorted(gemms)
    kernels, name = 0, None
    for line in report.splitlines():
        if "Compiling entry function" in line:  # the mangled name; a GEMM's template args: mode, warps, k-steps
            m = re.search(r"moe_gemm_kernelILi(\d+)ELi(\d+)ELi(\d+)", line)
            name = ("moe_gemm_kernel", *m.groups()) if m else line
        if m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line):
            kernels += 1
            if name in MAY_SPILL:
                assert int(m[2]) <= 16, (name, line)
            else:
                assert m.groups() == ("0", "0", "0"), (name, line)
        if m := re.search(r"(\d+) bytes smem", line):
            assert int(m[1]) <= SM120_SMEM, line
    assert kernels > 0, report[-2000:]


@needs_nvcc
@pytest.mark.parametrize("src", SOURCES, ids=[p.name for p in SOURCES])
def test_every_kernel_lets_an_early_launched_successor_start(src, tmp_path):
    """Each kernel releases its dependents at its start (csrc/pdl.cuh): the Triton kernel after it, launched as a
    programmatic dependent under DDTREE_PDL=1, may prefetch its weights while it runs (sm_90a's PTX). The MoE's
    gate/up GEMM releases only after its own wait: the down GEMM after it reads align's blocks before waiting
    (released at gate/up's start, a graph replay of variant 14 read them unwritten)."""
    res = run_nvcc([NVCC, "-std=c++17", "--expt-relaxed-constexpr", "-ptx", "-arch=compute_90a", str(src), "-o",
                    str(tmp_path / "k.ptx")])
    assert res.returncode == 0, res.stderr[-4000:]
    ptx = (tmp_path / "k.ptx").read_text()
    entries = ptx.split(".entry ")[1:]
    assert entries and all("griddepcontrol.launch_dependents" in e for e in entries)
    gate_up = [e for e in entries if re.match(r"\w*moe_gemm_kernelILi1E", e)]  # Mode kGateUp = 1
    assert bool(gate_up) == (src.name == "moe_int4.cu")
    assert all(0 <= e.find("griddepcontrol.wait") < e.find("griddepcontrol.launch_dependents") for e in gate_up)


@needs_nvcc
def test_shared_library_links(tmp_path):
    """The exact command the JIT build uses (both archs + PTX) links into one .so."""
    res = run_nvcc(build.nvcc_command(NVCC, SOURCES, tmp_path / "lib.so"))
    assert res.returncode == 0, res.stderr[-4000:]
    # the MLA kernel's dynamic shared memory (host arithmetic, no GPU): two stages fit an sm_120 block with one
    # or two row groups, the launcher takes four only where the GPU opts into more (the H200's 227 KB)
    import ctypes

    lib = ctypes.CDLL(str(tmp_path / "lib.so"))
    assert lib.ddt_mla_smem_bytes(2, 1) < lib.ddt_mla_smem_bytes(2, 2) <= SM120_SMEM
    assert SM120_SMEM < lib.ddt_mla_smem_bytes(4, 1) < lib.ddt_mla_smem_bytes(4, 2) <= 227 * 1024
    # the wide engine's 64-row CTA fits sm_90's block, not sm_120's (the plan keeps the narrow engine there)
    assert SM120_SMEM < lib.ddt_mla_wide_smem_bytes() <= 227 * 1024


def test_launchers_pass_what_the_c_definitions_take():
    """build.exports reads each entry point's argtypes from its C definition; every Python call site
    (ops/cuda_*.py) passes that many arguments, and a scalar the ctypes form cannot hold is refused."""
    import ast
    import ctypes

    exports = build.exports()
    assert set(exports) == {"ddt_moe_forward", "ddt_route", "ddt_rms_norm", "ddt_mla_attention", "ddt_mla_smem_bytes",
                            "ddt_mla_smem_optin", "ddt_mla_smem_per_sm", "ddt_mla_wide_smem_bytes"} and len(exports["ddt_moe_forward"]) == 22
    assert exports["ddt_route"][5] is ctypes.c_float and exports["ddt_rms_norm"][6] is ctypes.c_int64
    calls = 0
    for path in sorted((Path(build.__file__).parent).glob("cuda_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in exports:
                assert len(node.args) == len(exports[node.func.attr]), (path.name, node.func.attr)
                calls += 1
    assert calls == 9


def test_an_unknown_c_parameter_type_is_a_build_error(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text('extern "C" {\nint ddt_probe(const float* x, double d, int n) {\n  return 0;\n}\n}\n')
    with pytest.raises(build.KernelBuildError, match="double d"):
        build.exports([src])


def test_the_wide_plan_knows_the_kernels_rows_and_stages():
    """ops/cuda_mla.py plans wide CTAs with csrc/mla_wide.cu's rows a CTA and pipeline stages (two languages)."""
    from ddtree_chat.engine.ops import cuda_mla

    csrc = Path(build.__file__).parents[2] / "csrc"
    rows = re.search(r"constexpr int kWideRows = (\d+);", (csrc / "mla_common.cuh").read_text())
    stages = re.search(r"constexpr int kWStages = (\d+);", (csrc / "mla_wide.cu").read_text())
    assert rows and stages
    assert (int(rows[1]), int(stages[1])) == (cuda_mla.WIDE_ROWS, cuda_mla.WIDE_STAGES)
