"""The first start's parallel Triton compile (engine/ops/precompile.py), on the CPU: the registry serves a
skipped kernel's op by its reference, discovery records and restores, the pool compiles side by side.
The GPU half (Triton's hook inside real launches, a cold start's time) runs in tests/test_graphs.py."""

from __future__ import annotations

import os
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


class _Kernel:
    """Stands for a module-level Triton kernel (a decorator over its function, with Triton's preload):
    preload(path) appends the pid of the process that compiles to the file; a spec ending in '!' fails in any
    process but the one that created the pool."""

    def __init__(self, fn):
        self.fn, self.__name__ = fn, fn.__name__

    def preload(self, spec):
        path, _, owner = spec.partition("!")
        if owner and int(owner) != os.getpid():
            raise RuntimeError("no GPU in this worker")
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\n")


@_Kernel
def module_kernel():
    pass


def test_worker_processes_compile_importable_kernels_and_this_process_loads_them(tmp_path):
    """The GIL-free path: a kernel another process can import compiles in a worker (then this process loads
    it, from Triton's file cache on a GPU); one the worker fails on, or one built inside a function, compiles
    here. Both count as compiled."""
    assert precompile.importable(module_kernel) == (__name__, "module_kernel")
    local = _Kernel(lambda: None)
    assert precompile.importable(local) is None and precompile.importable(object()) is None
    a, b, c = (tmp_path / n for n in "abc")
    with precompile.Pool(workers=2, processes=True) as pool:
        pool.submit(module_kernel, str(a))
        pool.submit(module_kernel, f"{b}!{os.getpid()}")  # the worker fails: compiled here
        pool.submit(local, str(c))
        assert pool.wait() == 3 and pool.elsewhere == 1
    worker, here = a.read_text().split()
    assert int(worker) != os.getpid() and int(here) == os.getpid()
    assert b.read_text().split() == c.read_text().split() == [str(os.getpid())]


def test_workers_that_cannot_start_leave_the_load_going(monkeypatch, tmp_path):
    def no_processes(*a, **k):
        raise OSError("Resource temporarily unavailable")

    monkeypatch.setattr(precompile, "Workers", no_processes)
    with precompile.Pool(workers=1, processes=True) as pool:  # the compiles go to threads
        pool.submit(module_kernel, str(tmp_path / "a"))
        assert pool._procs is None and pool.wait() == 1 and pool.elsewhere == 0


def test_a_dead_worker_is_left_out_and_the_last_one_dying_is_an_error(tmp_path):
    from ddtree_chat.engine.ops.compile_workers import Workers

    w = Workers(2)
    try:
        w._procs[0].kill()
        w._procs[0].wait(10)
        for _ in range(2):  # whichever worker each call takes, the dead one fails once and is dropped
            try:
                w.compile(__name__, "module_kernel", str(tmp_path / "a"))
            except RuntimeError as e:
                assert "exited" in str(e)
        assert w.alive == 1
        w.compile(__name__, "module_kernel", str(tmp_path / "a"))  # the live one compiles
        with pytest.raises(RuntimeError, match="no GPU in this worker"):  # its error comes back as text
            w.compile(__name__, "module_kernel", f"{tmp_path / 'b'}!{os.getpid()}")
        w._procs[1].kill()
        w._procs[1].wait(10)
        with pytest.raises(RuntimeError, match="exited"):
            w.compile(__name__, "module_kernel", str(tmp_path / "a"))
        with pytest.raises(RuntimeError, match="no compile worker left"):  # no wait for a worker that never comes
            w.compile(__name__, "module_kernel", str(tmp_path / "a"))
    finally:
        w.close()


@_Kernel
def env_kernel():
    pass


env_kernel.preload = lambda path: open(path, "w").write(f"{os.environ.get('CUDA_VISIBLE_DEVICES')} {os.nice(0)}")


def test_a_worker_sees_only_its_gpu_and_yields_the_cores_to_the_load(monkeypatch, tmp_path):
    """A worker compiling for device 1 of this process's visible list sees that one GPU alone (so it never needs
    a CUDA context of its own), and runs at a lower priority than the load and nvcc build beside it."""
    from ddtree_chat.engine.ops.compile_workers import Workers, visible_device

    assert visible_device(None, 2) == "2" and visible_device("", 0) == "0"
    assert visible_device("3, GPU-ab12", 1) == "GPU-ab12"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    w = Workers(1, device=1)
    try:
        w.compile(__name__, "env_kernel", str(tmp_path / "env"))
    finally:
        w.close()
    seen, niceness = (tmp_path / "env").read_text().split()
    assert seen == "5" and int(niceness) >= min(19, os.nice(0) + 10)


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


def test_worker_processes_are_capped_below_the_compile_threads(monkeypatch):
    """Each worker process holds its own torch and engine: a many-core host gets MAX_WORKER_PROCESSES of them
    behind its compile threads."""
    started = []
    monkeypatch.setattr(precompile, "Workers", lambda n, device: started.append(n) or None)
    with precompile.Pool(workers=precompile.MAX_WORKERS, processes=True) as pool:
        assert pool._ex._max_workers == precompile.MAX_WORKERS
    assert started == [precompile.MAX_WORKER_PROCESSES] < [precompile.MAX_WORKERS]
