"""Worker processes for a first start's Triton compiles (ops/precompile.py). Each is this module run as a
program of its own (`python -m`; multiprocessing's spawn would re-run the user's main script in every
worker) that compiles one kernel at a time into Triton's file cache, from which the starting process then
loads it. Protocol, one JSON line each way: [module, name, specialisation data] in, null or the error out."""

from __future__ import annotations

import importlib
import json
import os
import queue
import subprocess
import sys
import threading


def visible_device(visible: str | None, index: int) -> str:
    """CUDA_VISIBLE_DEVICES for a process that must see only device `index` of this process's visible list."""
    if not visible:
        return str(index)
    return visible.split(",")[index].strip()


def resolve(module: str, name: str):
    """The Triton kernel a module defines under name (through an autotuner's or heuristics' wrapping)."""
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    while hasattr(obj, "fn") and not hasattr(obj, "preload"):  # NOTE: an autotuner or heuristics wraps it
        obj = obj.fn
    return obj


class Workers:
    """n worker processes compiling for CUDA device `device` (None: the current one). compile() may be called
    from several threads at once: each call takes an idle worker."""

    def __init__(self, n: int, device: int | None = None):
        # NOTE: the workers import kernels by module name: they get this process's import path
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        if device is not None:  # NOTE: seeing one GPU, a worker compiles for it without creating a CUDA context
            env["CUDA_VISIBLE_DEVICES"] = visible_device(os.environ.get("CUDA_VISIBLE_DEVICES"), device)
        cmd = [sys.executable, "-m", __name__]
        self._idle: queue.Queue = queue.Queue()
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self.alive = 0
        try:
            for _ in range(n):
                p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=env)
                self._procs.append(p)
                self._idle.put(p)
                self.alive += 1
        except BaseException:
            self.close()
            raise

    def compile(self, module: str, name: str, spec: str) -> None:
        """Compile the kernel in an idle worker; RuntimeError with the worker's error, or when none is left."""
        while True:
            with self._lock:
                if self.alive == 0:
                    raise RuntimeError("no compile worker left")
            try:
                p = self._idle.get(timeout=0.5)
                break
            except queue.Empty:
                continue
        try:
            p.stdin.write(json.dumps([module, name, spec]) + "\n")
            p.stdin.flush()
            reply = p.stdout.readline()
        except (OSError, ValueError):  # NOTE: a worker that exited, or one closed
            reply = ""
        if not reply:
            with self._lock:
                self.alive -= 1
            raise RuntimeError(f"a compile worker exited (status {p.poll()})")
        self._idle.put(p)
        error = json.loads(reply)
        if error is not None:
            raise RuntimeError(error)

    def close(self) -> None:
        """End the workers (each exits at the end of its input), without waiting for them."""
        for p in self._procs:
            try:
                p.stdin.close()
            except OSError:
                pass


def main() -> None:
    if hasattr(os, "nice"):
        os.nice(10)  # NOTE: a first start's load and nvcc build run beside the workers' imports: they go first
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # NOTE: a print from Triton or ptxas would corrupt the replies
    import triton  # noqa: F401 - paid before the first kernel arrives

    for line in sys.stdin:
        module, name, spec = json.loads(line)
        try:
            resolve(module, name).preload(spec)
            error = None
        except Exception as e:  # noqa: BLE001 - sent back: the starting process compiles that kernel itself
            error = f"{type(e).__name__}: {e}"[:500]
        replies.write(json.dumps(error) + "\n")


if __name__ == "__main__":
    main()
