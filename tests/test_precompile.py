"""The first start's parallel Triton compile (engine/ops/precompile.py), on the CPU: the registry serves a
skipped kernel's op by its reference, discovery records and restores, the pool compiles side by side.
The GPU half (Triton's hook inside real launches, a cold start's time) runs in tests/test_graphs.py."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from ddtree_chat.engine.ops import precompile, registry


class _OnGpu:
    """Stands for a CUDA tensor in the dispatch (only is_cuda and dtype are read)."""
    is_cuda, dtype = True, torch.float32


def test_a_kernel_skipped_in_discovery_is_served_by_the_reference():
    op = registry.Op("test_precompile_op", lambda x: "reference")
    calls = []

    def kernel(x):
        calls.append(x)
        raise precompile.Skipped("new kernel")

    op.register(kernel)
    try:
        assert op(_OnGpu()) == "reference" and len(calls) == 1
        assert op.kernels[0].broken is None  # a skipped launch is not a broken kernel
    finally:
        registry.OPS.pop("test_precompile_op", None)


def test_discovery_records_each_compile_once_and_puts_everything_back():
    from triton import knobs
    from triton.runtime.jit import JitFunctionInfo

    from ddtree_chat.engine.ops import triton_mla, triton_rope

    tuner, jf = triton_mla._mla_split_kernel, triton_rope._rope_kernel
    bench, results, cache = tuner.do_bench, tuner.cache_results, dict(tuner.cache)
    started = []
    with precompile.discovery(lambda *job: started.append(job)) as found:
        hook = knobs.runtime.jit_cache_hook

        def call():
            return hook(key="k", repr="r", fn=JitFunctionInfo(jf.__module__, "_rope_kernel", jf),
                        compile={"key": "k", "specialization_data": '{"name": "_rope_kernel"}'},
                        is_manual_warmup=False, already_compiled=False)

        for _ in range(2):
            with pytest.raises(precompile.Skipped):
                call()
        other = []  # a compile thread's own launch of the kernel compiles: the hook lets it through
        t = threading.Thread(target=lambda: other.append(call()))
        t.start()
        t.join(5)
        assert other == [None] and started == [(jf, '{"name": "_rope_kernel"}')]  # handed over once
        # the autotuner times nothing and sees each config's call (a new kernel's Skipped swallowed)
        seen = []

        def new_config():
            seen.append("called")
            raise precompile.Skipped("new kernel")

        assert tuner.do_bench(new_config) == [0.0, 0.0, 0.0] and seen == ["called"] and not tuner.cache_results
        tuner.cache[("made in discovery",)] = tuner.configs[0]
    assert list(found.values()) == [(jf, '{"name": "_rope_kernel"}')]
    assert knobs.runtime.jit_cache_hook is None and tuner.do_bench is bench and tuner.cache_results == results
    assert tuner.cache == cache


def test_the_pool_preloads_side_by_side_and_leaves_failures_to_the_recording(caplog):
    seen, gate = [], threading.Barrier(2, timeout=10)

    class Kernel:
        __name__ = "k"

        def __init__(self, fail):
            self.fail = fail

        def preload(self, spec):
            gate.wait()  # NOTE: both must be in flight at once: two threads
            seen.append(spec)
            if self.fail:
                raise RuntimeError("no such target")

    reports = []
    with precompile.Pool(workers=2, report=lambda *a: reports.append(a)) as pool:
        assert pool.wait() == 0  # nothing handed over yet
        pool.submit(Kernel(False), "spec-a")
        pool.submit(Kernel(True), "spec-b")
        assert pool.wait() == 1
    assert sorted(seen) == ["spec-a", "spec-b"] and "it compiles when recorded" in caplog.text
    assert reports == [(1, 2), (2, 2)]  # one per kernel, a failure included


def test_the_pool_compiles_each_kernel_once_while_more_are_handed_over():
    release, seen = threading.Event(), []

    class Kernel:
        __name__ = "k"

        def preload(self, spec):
            release.wait(10)
            seen.append(spec)

    a, b, reports = Kernel(), Kernel(), []
    with precompile.Pool(workers=2, report=lambda *r: reports.append(r)) as pool:
        pool.submit(a, "s1")
        pool.submit(a, "s1")  # found again in a later pass: not compiled twice
        pool.submit(b, "s1")  # another kernel, same spec text
        assert pool.submitted == 2 and not seen  # nothing waited for yet: the compiles are still running
        release.set()
        assert pool.wait() == 2 and sorted(seen) == ["s1", "s1"]
        pool.submit(a, "s2")
        assert pool.wait() == 3 and reports == [(1, 2), (2, 2), (3, 3)]
        assert pool.names == {"k": 3}  # the specialisations per kernel name (the first start's log lists them)


def test_the_cuda_build_in_the_background_is_the_one_the_kernels_get(monkeypatch):
    """A first start's nvcc build runs in a thread while the checkpoint loads; the caller that needs the
    kernels waits for that build instead of starting a second one, and gets its error when it failed."""
    from ddtree_chat.engine.ops import build

    calls, release = [], threading.Event()

    def slow_build():
        calls.append(threading.current_thread().name)
        release.wait(10)
        return "lib"

    monkeypatch.setattr(build, "_LIB", None)
    monkeypatch.setattr(build, "_ERROR", None)
    monkeypatch.setattr(build, "_build", slow_build)
    t = build.build_in_background()
    while not calls:
        time.sleep(0.01)
    release.set()
    assert build.library() == "lib" and calls == ["ddtree-cuda-build"]  # waited for the thread's build
    t.join(5)

    def failing():
        raise build.KernelBuildError("nvcc not found")

    monkeypatch.setattr(build, "_LIB", None)
    monkeypatch.setattr(build, "_build", failing)
    build.build_in_background().join(5)  # the thread swallows it ...
    with pytest.raises(build.KernelBuildError, match="nvcc not found"):
        build.library()  # ... the caller gets it


def test_compile_threads_are_the_cores_at_most_max_workers(monkeypatch):
    monkeypatch.setattr(precompile.os, "cpu_count", lambda: 128)
    assert precompile.default_workers(200) == precompile.MAX_WORKERS and precompile.default_workers(5) == 5
    monkeypatch.setattr(precompile.os, "cpu_count", lambda: 4)
    assert precompile.default_workers(200) == 4
