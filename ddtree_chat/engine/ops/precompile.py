"""A first start's Triton compiles, in parallel.

Recording the CUDA graphs compiles every Triton kernel the programs launch, one after another (a cold start
of the demo: ~100 compiles, over half a minute). Instead the programs first run once under `discovery()`:
each Triton kernel not compiled yet is recorded (Triton's specialisation data) instead of compiled, and its
op is served by its pure-torch reference (registry.Op.run catches `Skipped`), so every value downstream stays
real; each one found goes at once to `Pool`, which compiles it while discovery goes on; the recording that
follows finds them compiled. The compiles run in worker processes (compile_workers.py): Triton's front end (the kernel's AST to
IR) is Python, so compile threads would hold the GIL that discovery needs. A worker compiles into Triton's
file cache; a thread of this process then loads the kernel from there (or compiles it itself when the
worker could not)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Callable, Iterator

from .compile_workers import Workers, resolve

log = logging.getLogger(__name__)


class Skipped(Exception):
    """Discovery: a Triton kernel's compile was recorded and its launch skipped."""


def _autotuners() -> list:
    """The Autotuner objects of the loaded ops modules (their benchmarking would time skipped launches)."""
    from triton.runtime.autotuner import Autotuner

    mods = [m for name, m in list(sys.modules.items()) if name.startswith(__package__ + ".") and m is not None]
    return [v for m in mods for v in vars(m).values() if isinstance(v, Autotuner)]


def _see_each_config(kernel_call, quantiles=None, **_):
    """An autotuner's timing during discovery: run the config's call (recorded if new), time nothing."""
    try:
        kernel_call()
    except Skipped:
        pass
    return [0.0, 0.0, 0.0]


@contextlib.contextmanager
def discovery(start: Callable | None = None) -> Iterator[dict]:
    """Within, in this thread: every Triton compile is recorded in the yielded dict ((kernel id, spec) ->
    (kernel, spec)) and raises Skipped instead of compiling; start(kernel, spec), when given, is called once
    for each as it is found (Pool.submit). Compiles in other threads (the pool's) go ahead. Autotuners see
    every config and keep no choice made here."""
    from triton import knobs

    found: dict = {}
    me = threading.get_ident()

    def hook(*, fn, compile, **_):
        if threading.get_ident() != me:
            return None  # NOTE: a pool thread's own preload: compile it
        spec = compile["specialization_data"]
        key = (id(fn.jit_function), spec)
        if key not in found:
            found[key] = (fn.jit_function, spec)
            if start is not None:
                start(fn.jit_function, spec)
        raise Skipped(fn.name)

    tuners = [(t, t.do_bench, t.cache_results, dict(t.cache)) for t in _autotuners()]
    before = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = hook
    for t, *_ in tuners:
        t.do_bench, t.cache_results = _see_each_config, False
    try:
        yield found
    finally:
        knobs.runtime.jit_cache_hook = before
        for t, bench, results, cache in tuners:
            t.do_bench, t.cache_results = bench, results
            t.cache.clear()
            t.cache.update(cache)


MAX_WORKERS = 32  # compile threads per process: each holds a compile's memory
MAX_WORKER_PROCESSES = 16  # each worker process imports torch and the engine (~0.4 GB of host memory)


def default_workers(jobs: int) -> int:
    """Threads for `jobs` compiles: one per core, at most MAX_WORKERS."""
    return max(1, min(jobs, MAX_WORKERS, os.cpu_count() or 1))


def _preload(kernel, spec) -> bool:
    """Compile one recorded kernel (Triton's preload of its spec: it lands in the in-process cache as a launch
    would put it). A failure is logged and left to the recording, which compiles that kernel itself (and
    reports a real error there)."""
    try:
        kernel.preload(spec)
        return True
    except Exception as e:  # noqa: BLE001 - the recording compiles it again and fails loudly if it must
        log.warning("precompiling %s failed (%s); it compiles when recorded", getattr(kernel, "__name__", kernel),
                    str(e).splitlines()[0][:200] if str(e) else type(e).__name__)
        return False


def importable(kernel) -> tuple[str, str] | None:
    """(module, name) under which another process finds this very kernel, or None (a kernel built inside a
    function, or not a Triton kernel)."""
    fn = getattr(kernel, "fn", None)
    where = (getattr(fn, "__module__", None), getattr(fn, "__qualname__", ""))
    if where[0] is None or "<locals>" in where[1]:
        return None
    try:
        return where if resolve(*where) is kernel else None
    except (ImportError, AttributeError):
        return None


def _index(device) -> int | None:
    import torch

    return None if device is None else torch.device(device).index


class Pool:
    """Compiles fed as kernels are found: each (kernel, spec) compiles once however often it is submitted.
    Each compile is a thread of this process that hands an importable kernel to a worker process (processes
    True) and then loads it from Triton's cache, or compiles it itself. device: the CUDA device the compiles
    target (a thread or worker starts on device 0); report(done, total) after each compile, from the thread
    that waits."""

    def __init__(self, device=None, workers: int | None = None, report=None, processes: bool = False):
        import torch

        start = (lambda: torch.cuda.set_device(device)) if device is not None else None
        n = workers or default_workers(MAX_WORKERS)
        self._ex = ThreadPoolExecutor(max_workers=n, initializer=start)
        self._procs = None
        if processes:
            try:
                self._procs = Workers(min(n, MAX_WORKER_PROCESSES), _index(device))
            except Exception as e:  # noqa: BLE001 - e.g. no processes left: threads compile
                log.info("no compile workers (%s): compiling in threads", e)
        self._seen: set = set()
        self.names: Counter = Counter()  # kernel name -> specialisations handed over (each one a compile)
        self._pending: list = []
        self.report, self.done, self.compiled, self.elsewhere = report, 0, 0, 0

    @property
    def submitted(self) -> int:
        return len(self._seen)

    def submit(self, kernel, spec) -> None:
        if (id(kernel), spec) not in self._seen:
            self._seen.add((id(kernel), spec))
            self.names[getattr(kernel, "__name__", str(kernel))] += 1
            self._pending.append(self._ex.submit(self._compile, kernel, spec))

    def _compile(self, kernel, spec) -> tuple[bool, bool]:
        """(compiled, by a worker)."""
        where = importable(kernel) if self._procs is not None else None
        there = False
        if where is not None:
            try:
                self._procs.compile(*where, spec)
                there = True
            except Exception as e:  # noqa: BLE001 - e.g. a worker that died: this process compiles it
                log.debug("a worker could not compile %s (%s): compiling it here", where[1], e)
        return _preload(kernel, spec), there

    def wait(self) -> int:
        """Wait for every compile submitted so far; the number that compiled, in all."""
        pending, self._pending = self._pending, []
        for future in as_completed(pending):
            compiled, there = future.result()
            self.done, self.compiled, self.elsewhere = self.done + 1, self.compiled + compiled, self.elsewhere + there
            if self.report:
                self.report(self.done, self.submitted)
        return self.compiled

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc) -> None:
        self._ex.shutdown(wait=True, cancel_futures=exc[0] is not None)
        if self._procs is not None:
            self._procs.close()
