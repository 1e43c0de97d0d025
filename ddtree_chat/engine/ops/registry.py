"""Kernel registry: ops look up a fast implementation by name; absent (CPU, no compiler) -> reference."""

from __future__ import annotations

from typing import Callable

_FAST: dict[str, Callable] = {}
_DISABLED = False


def register(name: str, fn: Callable) -> None:
    _FAST[name] = fn


def fast(name: str, x) -> Callable | None:
    """The registered kernel for `name` if x lives on CUDA and kernels are enabled."""
    if _DISABLED or not getattr(x, "is_cuda", False):
        return None
    return _FAST.get(name)


def set_enabled(enabled: bool) -> None:
    global _DISABLED
    _DISABLED = not enabled
