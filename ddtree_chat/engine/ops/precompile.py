"""A first start's Triton compiles, in parallel.

Recording the CUDA graphs compiles every Triton kernel the programs launch, one after another (a cold start
of the demo: ~40 compiles, over a minute). Instead the programs first run once under `discovery()`: each
Triton kernel not compiled yet is recorded (Triton's specialisation data) instead of compiled, and its op
is served by its pure-torch reference (registry.Op.run catches `Skipped`), so every value downstream stays
real; then `compile_all` compiles the recorded kernels in a thread pool (Triton's compile releases the
GIL); the recording that follows finds them compiled."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Iterator

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
def discovery() -> Iterator[dict]:
    """Within: every Triton compile is recorded in the yielded dict ((kernel id, spec) -> (kernel, spec))
    and raises Skipped instead of compiling. Autotuners see every config and keep no choice made here."""
    from triton import knobs

    found: dict = {}

    def hook(*, fn, compile, **_):
        spec = compile["specialization_data"]
        found.setdefault((id(fn.jit_function), spec), (fn.jit_function, spec))
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


def default_workers(jobs: int) -> int:
    """Threads for `jobs` compiles: one per core, at most MAX_WORKERS."""
    return max(1, min(jobs, MAX_WORKERS, os.cpu_count() or 1))


def compile_all(found: dict, device=None, workers: int | None = None, report=None) -> int:
    """Compile the recorded kernels side by side (Triton's preload of each spec: the kernel lands in its
    in-process cache as a launch would put it); returns how many compiled. A failure is logged and left
    to the recording, which compiles that kernel itself (and reports a real error there). device: the
    CUDA device each thread compiles for (a thread starts on device 0); report(done, total) after each."""
    jobs = list(found.values())
    if not jobs:
        return 0

    def one(job) -> bool:
        kernel, spec = job
        try:
            kernel.preload(spec)
            return True
        except Exception as e:  # noqa: BLE001 - the recording compiles it again and fails loudly if it must
            log.warning("precompiling %s failed (%s); it compiles when recorded", getattr(kernel, "__name__", kernel),
                        str(e).splitlines()[0][:200] if str(e) else type(e).__name__)
            return False

    import torch

    start = (lambda: torch.cuda.set_device(device)) if device is not None else None
    ok = 0
    with ThreadPoolExecutor(max_workers=workers or default_workers(len(jobs)), initializer=start) as pool:
        for i, done in enumerate(as_completed([pool.submit(one, job) for job in jobs])):
            ok += done.result()
            if report:
                report(i + 1, len(jobs))
    return ok
