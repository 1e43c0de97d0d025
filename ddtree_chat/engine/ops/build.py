"""JIT build of ddtree_chat/csrc/*.cu with plain nvcc into one shared library, loaded with ctypes.

Built on first use into cache_dir()/kernels/<hash of sources + archs + torch/CUDA version + nvcc>, for
sm_90a and sm_120a (+ compute_120a PTX). No torch headers: a build takes seconds, not a minute.
Failures raise KernelBuildError with a readable reason; callers then keep the reference ops."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

CSRC = Path(__file__).resolve().parents[2] / "csrc"
GENCODE = [
    "-gencode", "arch=compute_90a,code=sm_90a",
    "-gencode", "arch=compute_120a,code=sm_120a",
    "-gencode", "arch=compute_120a,code=compute_120a",
]
# --threads 0: the three targets compile side by side (a first start waits for this build)
FLAGS = ["-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-lineinfo", "--expt-relaxed-constexpr", "--threads", "0"]


def flags() -> list[str]:
    """FLAGS, and DDT_MOE_SWEEP (every MoE variant) when DDTREE_MOE_SWEEP=1."""
    from ... import knobs

    return FLAGS + (["-DDDT_MOE_SWEEP"] if knobs.moe_sweep() else [])

_LOCK = threading.Lock()
_LIB: ctypes.CDLL | None = None
_ERROR: str | None = None
build_seconds: float | None = None  # first-use build time of this process (None: loaded from cache)


class KernelBuildError(RuntimeError):
    """No compiler, no GPU, or a compile error: the reference ops stay in use."""


def find_nvcc() -> str | None:
    for cand in (os.environ.get("DDTREE_NVCC"), shutil.which("nvcc"),
                 os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def sources() -> list[Path]:
    return sorted(CSRC.glob("*.cu"))


def _key(nvcc: str) -> str:
    h = hashlib.sha256()
    for p in sorted(CSRC.glob("*.cu")) + sorted(CSRC.glob("*.cuh")) + sorted(CSRC.glob("*.h")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    h.update(" ".join(GENCODE + flags()).encode())
    try:
        import torch
        h.update(f"{torch.__version__}|{torch.version.cuda}".encode())
    except Exception:  # pragma: no cover
        pass
    h.update(subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.encode())
    return h.hexdigest()[:16]


def link_flags(nvcc: str) -> list[str]:
    """-L to a pip nvcc wheel's lib/ (it keeps cudart_static there, not in nvcc.profile's lib64); none for a
    system nvcc."""
    lib = Path(nvcc).resolve().parents[1] / "lib"
    return ["-L", str(lib)] if (lib / "libcudart_static.a").is_file() else []


def nvcc_command(nvcc: str, srcs: list[Path], out: Path, extra: list[str] | None = None) -> list[str]:
    return [nvcc, *flags(), *GENCODE, *link_flags(nvcc), *(extra or []), *map(str, srcs), "-o", str(out)]


def run_nvcc(nvcc: str, cmd: list[str]) -> subprocess.CompletedProcess:
    # NOTE: nvcc's own directory first on PATH, so it runs its own ptxas (an older one rejects newer PTX)
    env = dict(os.environ, PATH=os.path.dirname(nvcc) + os.pathsep + os.environ.get("PATH", ""))
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


def _build() -> ctypes.CDLL:
    global build_seconds
    nvcc = find_nvcc()
    if nvcc is None:
        raise KernelBuildError("nvcc not found (set DDTREE_NVCC or CUDA_HOME); using the reference ops")
    from ...paths import cache_dir

    d = cache_dir() / "kernels" / _key(nvcc)
    lib = d / "libddtree_kernels.so"
    if not lib.exists():
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f"tmp-{os.getpid()}.so"
        t0 = time.perf_counter()
        res = run_nvcc(nvcc, nvcc_command(nvcc, sources(), tmp))
        if res.returncode != 0:
            raise KernelBuildError(f"nvcc failed building the CUDA kernels:\n{res.stderr[-4000:]}")
        os.replace(tmp, lib)
        build_seconds = time.perf_counter() - t0
        log.info("built CUDA kernels in %.1f s -> %s", build_seconds, lib)
    try:
        so = ctypes.CDLL(str(lib))
    except OSError as e:
        raise KernelBuildError(f"could not load {lib}: {e}") from e
    _declare(so)
    return so


_C_TYPES = {"int": ctypes.c_int, "float": ctypes.c_float, "int64_t": ctypes.c_int64}
_EXPORT = re.compile(r"^int\s+(ddt_\w+)\s*\(([^)]*)\)\s*\{", re.M)


def exports(srcs: list[Path] | None = None) -> dict[str, list]:
    """Each exported entry point's ctypes argtypes, read from its C definition in csrc/*.cu (the one
    declaration: a launcher that passes another count of arguments is a TypeError, not a corrupt call).
    Pointers of any type pass as c_void_p; scalars must be int, float or int64_t."""
    out = {}
    for src in srcs if srcs is not None else sources():
        for name, params in _EXPORT.findall(src.read_text()):
            types = []
            for param in params.split(",") if params.strip() else []:  # NOTE: "()" takes nothing
                decl = " ".join(param.split())
                if "*" in decl:
                    types.append(ctypes.c_void_p)
                    continue
                ctype = decl.rsplit(" ", 1)[0].replace("const ", "")
                if ctype not in _C_TYPES:
                    raise KernelBuildError(f"{src.name}: {name}: no ctypes form for parameter {decl!r}")
                types.append(_C_TYPES[ctype])
            out[name] = types
    return out


def _declare(so: ctypes.CDLL) -> None:
    for name, types in exports().items():
        fn = getattr(so, name)
        fn.argtypes, fn.restype = types, ctypes.c_int


def library() -> ctypes.CDLL:
    """The loaded kernel library; raises KernelBuildError (cached) when it cannot be had."""
    global _LIB, _ERROR
    with _LOCK:
        if _LIB is not None:
            return _LIB
        if _ERROR is not None:
            raise KernelBuildError(_ERROR)
        try:
            _LIB = _build()
        except KernelBuildError as e:
            _ERROR = str(e)
            raise
        return _LIB


def build_in_background() -> threading.Thread:
    """library() in a thread: a first start's nvcc build runs while the checkpoint loads; the first caller
    that needs the kernels waits for it (the lock) and gets its error, if any."""
    def run() -> None:
        try:
            library()
        except Exception:  # noqa: BLE001 - library() raises it again to the caller that needs the kernels
            pass

    t = threading.Thread(target=run, name="ddtree-cuda-build", daemon=True)
    t.start()
    return t


def check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"CUDA error {rc} in {what}")
