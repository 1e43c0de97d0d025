"""Which device, dtype, matrix library and thread count a rank runs with: decided once at load, from the
machine and the model (never from the round's code)."""

from __future__ import annotations

import os
import time

import torch

from .. import knobs
from .errors import DeviceError
from .memory import weight_bytes

SMALL_MODEL_PARAMS = 200_000_000  # below this a CPU rank runs one intra-op thread


def pick_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError("--device cuda was asked for but no CUDA GPU is visible; use --device cpu.")
    if dev.type not in ("cpu", "cuda"):
        raise DeviceError(f"device {device!r} is not supported; use cpu or cuda.")
    return dev


def default_dtype(cfg, dev: torch.device) -> torch.dtype:
    """float32 on CPU (the reference) and for small models on GPU (exact AR/tree agreement costs nothing
    there); bf16 for real checkpoints on GPU."""
    if dev.type != "cuda" or weight_bytes(cfg) < 2 * 1024**3:
        return torch.float32
    return torch.bfloat16


def prefer_blas(dtype: torch.dtype) -> None:
    """NOTE: cuBLAS's float32 heuristics pick slow kernels for 8-row products of the demo's size (tree
    verify, the drafter block); cuBLASLt's do not (BENCHMARKS.md). DDTREE_BLAS overrides."""
    torch.backends.cuda.preferred_blas_library(knobs.blas() or ("cublaslt" if dtype == torch.float32 else "cublas"))


def cpu_bf16_is_faster(cfg) -> bool:
    """Whether this CPU multiplies the drafter's lm-head shape faster in bf16 than in fp32 (CPUs with
    AVX512-BF16/AMX do; others can be several times slower), timed once at load."""
    x, w = torch.randn(8, cfg.hidden_size), torch.randn(min(cfg.vocab_size, 8192), cfg.hidden_size)

    def best(dt) -> float:
        a, b = x.to(dt), w.to(dt)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            a @ b.T
            times.append(time.perf_counter() - t0)
        return min(times[1:])

    return best(torch.bfloat16) < 0.8 * best(torch.float32)


def limit_cpu_threads(model: torch.nn.Module) -> None:
    """NOTE: small models run many tiny ops; intra-op threads cost more than they give (and on a loaded
    2-core box OpenMP spinning made each op ~1000x slower). OMP_NUM_THREADS, when set, wins."""
    if "OMP_NUM_THREADS" not in os.environ and sum(p.numel() for p in model.parameters()) < SMALL_MODEL_PARAMS:
        torch.set_num_threads(1)


def pack_cpu_products(dec) -> None:
    """A CPU decoder's product weights packed on first use (ops/cpu_packed.py): the target's, the drafter's and
    the drafter's own-dtype copy of the lm head."""
    from .ops import cpu_packed

    for model in (dec.target, dec.drafter):
        if model is not None:
            cpu_packed.mark(model)
    if dec.draft_head is not None:
        cpu_packed.mark_tensor(dec.draft_head)


def machine(device: torch.device) -> str:
    """What the verify cost curve depends on besides the model: the GPU model and the kernels in use (a
    cached curve from another GPU, or from before a kernel landed, would mislead --budget auto)."""
    if device.type != "cuda":
        return str(device)
    from .ops import gpu

    return f"{torch.cuda.get_device_name(device).replace(' ', '_')}-k{gpu.fingerprint()}"
