"""Kernel registry: ops look up a fast implementation by name; absent (CPU, no compiler) -> reference."""

from __future__ import annotations

from typing import Callable

import torch

_FAST: dict[str, tuple[Callable, frozenset | None]] = {}


def register(name: str, fn: Callable, dtypes=None) -> None:
    """dtypes: the activation dtypes the kernel is exact enough for (None: any)."""
    _FAST[name] = (fn, frozenset(dtypes) if dtypes is not None else None)


def fast(name: str, x) -> Callable | None:
    """The registered kernel for `name` if x lives on CUDA in a dtype it serves (ops/gpu.py registers
    them; DDTREE_KERNELS=0 stops it)."""
    if not getattr(x, "is_cuda", False) or name not in _FAST:
        return None
    fn, dtypes = _FAST[name]
    return fn if dtypes is None or x.dtype in dtypes else None


def dispatch(name: str, x, ref: Callable, *args):
    """The registered kernel's result for args when one serves x, else ref(*args). A kernel returns None
    for the shapes it declines (ops/gpu.py's guard also returns None after a kernel failed for good).
    NOTE: the kernels have no backward: a call that autograd records (training) takes the reference."""
    fn = fast(name, x)
    if fn and torch.is_grad_enabled() and any(getattr(a, "requires_grad", False) for a in args):
        fn = None
    out = fn(*args) if fn else None
    return out if out is not None else ref(*args)
