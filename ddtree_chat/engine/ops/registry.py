"""Kernel registry: ops look up a fast implementation by name; absent (CPU, no compiler) -> reference."""

from __future__ import annotations

from typing import Callable

_FAST: dict[str, Callable] = {}


def register(name: str, fn: Callable) -> None:
    _FAST[name] = fn


def fast(name: str, x) -> Callable | None:
    """The registered kernel for `name` if x lives on CUDA (ops/gpu.py registers them; DDTREE_KERNELS=0 stops it)."""
    if not getattr(x, "is_cuda", False):
        return None
    return _FAST.get(name)
