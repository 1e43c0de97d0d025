"""Kernel registry: ops look up a fast implementation by name; absent (CPU, no compiler) -> reference."""

from __future__ import annotations

import contextlib
import contextvars
from typing import Callable, Iterator

import torch

_FAST: dict[str, list[tuple[Callable, frozenset | None]]] = {}
_LIBRARY = contextvars.ContextVar("ddtree_prefer_library", default=False)


@contextlib.contextmanager
def prefer_library() -> Iterator[None]:
    """Forwards launched op by op from Python (a prefill, an eager round): the small-M products take the
    library path (cuBLAS) instead of the Triton kernel, whose launch costs ~0.1 ms of host time (argument
    binding, under cProfile; a graph replays it for free), several times a torch op's: a demo prefill on
    the H200 ran 0.3 ms of kernels in 15 ms of host time (BENCHMARKS.md)."""
    token = _LIBRARY.set(True)
    try:
        yield
    finally:
        _LIBRARY.reset(token)


def prefers_library() -> bool:
    return _LIBRARY.get()


def exact() -> bool:
    """Row-invariant kernels (default): a half-precision target's rows round the same in every round, so
    speculative output equals plain decoding bit for bit (docs/exactness.md). DDTREE_EXACT=0 takes the
    kernels picked by row count instead (cuBLAS products, the SM-count split plan, the MoE's few-token
    pipeline): faster where they win, but a bf16 tree may then drift from --mode ar."""
    from ...knobs import EXACT, get

    return get(EXACT) != "0"


def register(name: str, fn: Callable, dtypes=None, ahead: bool = False) -> None:
    """dtypes: the activation dtypes the kernel is exact enough for (None: any). ahead: try fn before the
    kernels already registered for name (dispatch moves on when it declines); else fn replaces them."""
    entry = (fn, frozenset(dtypes) if dtypes is not None else None)
    _FAST[name] = [entry] + _FAST.get(name, []) if ahead else [entry]


def _serving(name: str, x) -> list[Callable]:
    if not getattr(x, "is_cuda", False):
        return []
    return [fn for fn, dtypes in _FAST.get(name, ()) if dtypes is None or x.dtype in dtypes]


def fast(name: str, x) -> Callable | None:
    """The first registered kernel for `name` if x lives on CUDA in a dtype it serves (ops/gpu.py registers
    them; DDTREE_KERNELS=0 stops it)."""
    fns = _serving(name, x)
    return fns[0] if fns else None


def dispatch(name: str, x, ref: Callable, *args):
    """The first registered kernel's result for args that does not decline (None: a shape it does not
    serve, or ops/gpu.py's guard after a kernel failed for good), else ref(*args).
    NOTE: the kernels have no backward: a call that autograd records (training) takes the reference."""
    if torch.is_grad_enabled() and any(getattr(a, "requires_grad", False) for a in args):
        return ref(*args)
    for fn in _serving(name, x):
        out = fn(*args)
        if out is not None:
            return out
    return ref(*args)
