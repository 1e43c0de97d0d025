"""Kernel registry: one `Op` per hot-path op decides which implementation runs a call.

An Op holds its pure-torch reference and, in order, the kernels that may serve it on CUDA, each with the
activation dtypes it is exact enough for and a `supports(*args)` predicate (cheap Python on shapes,
strides and flags: dispatch runs per op call in eager forwards; a CUDA graph replays without Python).
The first kernel that accepts a call runs it; none: the reference. ops/gpu.py registers the kernels
(a no-op on CPU or with DDTREE_KERNELS=0); an op module may register a pure-torch form of its own
(`builtin`: kept with the kernels off, e.g. the MoE's graph-capturable dense experts).

A kernel that fails for good (a CUDA library that does not build, a Triton kernel that does not compile or
fit this GPU) is logged once and skipped from then on. In strict mode (DDTREE_STRICT=1 or `strict()`,
used by the GPU tests) that failure raises, and so does a kernel that accepted a call and then returned
None, unless it is registered with `declines` (its remaining shape checks still live inside it)."""

from __future__ import annotations

import contextlib
import contextvars
import logging
from typing import Callable, Iterator

import torch

from .precompile import Skipped

log = logging.getLogger(__name__)

_LIBRARY = contextvars.ContextVar("ddtree_prefer_library", default=False)
_STRICT = contextvars.ContextVar("ddtree_strict", default=None)
OPS: dict[str, "Op"] = {}


class KernelDeclined(RuntimeError):
    """Strict mode: a kernel accepted a call (supports) and then did not serve it, or failed for good."""


class Kernel:
    """One implementation of an op: fn(*args) -> the op's result (None: it declined after all)."""

    __slots__ = ("name", "fn", "dtypes", "supports", "errors", "builtin", "declines", "broken")

    def __init__(self, name: str, fn: Callable, dtypes=None, supports: Callable | None = None,
                 errors: tuple[type[BaseException], ...] = (), builtin: bool = False, declines: bool = False):
        self.name, self.fn, self.supports, self.errors, self.builtin = name, fn, supports, tuple(errors), builtin
        # declines: fn still checks some shapes itself and returns None for them (strict mode lets it)
        self.declines = declines
        self.dtypes = frozenset(dtypes) if dtypes is not None else None
        self.broken: BaseException | None = None

    def serves(self, x) -> bool:
        """The tensor-level rule alone (dtype, not broken): what `fast` reports."""
        return self.broken is None and (self.dtypes is None or x.dtype in self.dtypes)


class Op:
    """The op `name`: ref(*args) on CPU (and the test oracle); on CUDA its first accepting kernel. The
    dispatch keys on args[0] (its device and dtype) unless the caller names the tensor (`on`)."""

    def __init__(self, name: str, ref: Callable):
        self.name, self.ref = name, ref
        self.kernels: list[Kernel] = []
        OPS[name] = self

    def register(self, fn: Callable, dtypes=None, supports: Callable | None = None, ahead: bool = False,
                 errors=(), builtin: bool = False, declines: bool = False, name: str | None = None) -> Kernel:
        """ahead: tried before the kernels already there; else after them, but before every builtin form
        (so a registered kernel always comes ahead of the op's own pure-torch forms)."""
        k = Kernel(name or getattr(fn, "__name__", self.name), fn, dtypes, supports, errors, builtin, declines)
        if ahead:
            self.kernels.insert(0, k)
        else:
            at = next((i for i, e in enumerate(self.kernels) if e.builtin and not builtin), len(self.kernels))
            self.kernels.insert(at, k)
        return k

    def clear(self) -> None:
        """Drop the registered kernels (the builtin forms stay)."""
        self.kernels = [k for k in self.kernels if k.builtin]

    def __call__(self, *args):
        return self.run(self.ref, args[0], args)

    def on(self, x, *args):
        return self.run(self.ref, x, args)

    def run(self, ref: Callable, x, args: tuple):
        """The dispatch: args through the first kernel that accepts them, else ref(*args) (the op's
        reference, or a caller's equivalent form of it, e.g. F.linear for a 2-D product)."""
        if not self.kernels or not getattr(x, "is_cuda", False):
            return ref(*args)
        # NOTE: the kernels have no backward: a call that autograd records (training) takes the reference
        if torch.is_grad_enabled() and any(getattr(a, "requires_grad", False) for a in args):
            return ref(*args)
        dtype = x.dtype
        for k in self.kernels:
            if k.broken is not None or (k.dtypes is not None and dtype not in k.dtypes) \
                    or (k.supports is not None and not k.supports(*args)):
                continue
            try:
                out = self._run(k, args)
            except Skipped:  # NOTE: a first start's discovery (precompile.py): the reference gives real values
                return ref(*args)
            if out is not None:
                return out
            if k.broken is None and not k.declines and strict_mode():
                raise KernelDeclined(f"{self.name}: kernel {k.name} accepted the call and then declined it")
        return ref(*args)

    def _run(self, k: Kernel, args):
        if not k.errors:
            return k.fn(*args)
        try:
            return k.fn(*args)
        except k.errors as e:
            if strict_mode():
                raise
            k.broken = e
            log.warning("%s: fast kernel unavailable (%s); using the reference", self.name,
                        str(e).splitlines()[0][:200] if str(e) else type(e).__name__)
            return None

    def kernel_for(self, *args, x=None) -> Kernel | None:
        """The kernel that would be tried first for args (None: the reference), without running it."""
        x = args[0] if x is None else x
        if not getattr(x, "is_cuda", False):
            return None
        return next((k for k in self.kernels if k.serves(x) and (k.supports is None or k.supports(*args))), None)

    def fast(self, x) -> Callable | None:
        """The first registered (not builtin) kernel for x's device and dtype, shapes aside."""
        if not getattr(x, "is_cuda", False):
            return None
        return next((k.fn for k in self.kernels if not k.builtin and k.serves(x)), None)


def define(name: str, ref: Callable | None = None) -> Op:
    """The Op `name`, made on first use: its ops module defines it with its reference; ops/gpu.py may
    register kernels first (the tree's ops are defined by engine/tree.py, imported after ops/)."""
    o = OPS.get(name) or Op(name, ref)
    if ref is not None:
        o.ref = ref
    return o


@contextlib.contextmanager
def prefer_library() -> Iterator[None]:
    """Forwards launched op by op from Python (a prefill, an eager round): the small-M products take the
    library path (cuBLAS) instead of the Triton kernel, whose launch costs several times a torch op's host
    time (argument binding; a graph replays it for free): a demo prefill launched op by op is host-bound
    (BENCHMARKS.md, the prefill-chunk rows)."""
    token = _LIBRARY.set(True)
    try:
        yield
    finally:
        _LIBRARY.reset(token)


def prefers_library() -> bool:
    return _LIBRARY.get()


@contextlib.contextmanager
def strict(on: bool = True) -> Iterator[None]:
    """Within: a kernel that fails or declines a call it accepted raises instead of the reference serving."""
    token = _STRICT.set(on)
    try:
        yield
    finally:
        _STRICT.reset(token)


def strict_mode() -> bool:
    on = _STRICT.get()
    if on is None:
        from ...knobs import STRICT, get

        return get(STRICT) == "1"
    return on


def exact() -> bool:
    """Row-invariant kernels (default): a half-precision target's rows round the same in every round, so
    speculative output equals plain decoding bit for bit (docs/exactness.md). DDTREE_EXACT=0 takes the
    kernels picked by row count instead (cuBLAS products, the SM-count split plan, the MoE's few-token
    pipeline): faster where they win, but a bf16 tree may then drift from --mode ar."""
    from ...knobs import EXACT, get

    return get(EXACT) != "0"


def register(name: str, fn: Callable, dtypes=None, ahead: bool = False) -> Kernel:
    """fn as the op `name`'s kernel: ahead of the registered ones, or (without ahead) instead of them (the
    builtin forms stay): how a demo or a test swaps one in. ops/gpu.py registers through the Op itself."""
    o = define(name)
    if not ahead:
        o.clear()
    return o.register(fn, dtypes, ahead=ahead, declines=True)


def fast(name: str, x) -> Callable | None:
    """The first registered kernel for `name` if x lives on CUDA in a dtype it serves (shapes aside)."""
    o = OPS.get(name)
    return o.fast(x) if o is not None else None


def dispatch(name: str, x, ref: Callable, *args):
    """Op `name` on args keyed on x, ref serving where no kernel does (the Op is made on first use)."""
    return define(name, ref).run(ref, x, args)
