"""The worker processes of a tensor-parallel engine (rank 0 lives in the app's own process): start,
load, report, watch and shut down; and how rank 0 joins their group."""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from ..errors import EngineError
from .group import TPGroup, init_group
from .serve import Rank, serve


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def checkpoint_fingerprint(model_dir: str | Path, draft_dir: str | Path | None) -> str:
    h = hashlib.sha256()
    for d in (model_dir, draft_dir):
        if d is None:
            continue
        for name in ("config.json", "model.safetensors.index.json"):
            p = Path(d) / name
            if p.is_file():
                h.update(p.read_bytes())
    return h.hexdigest()


def _worker_main(rank: int, world: int, port: int, device: str, load_rank, load_kwargs: dict, status) -> None:
    """A worker process: join the group, load this rank (load_rank(tp=..., **load_kwargs) -> a Rank), serve."""
    # NOTE: Ctrl+C belongs to rank 0, which shuts the workers down in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_parent()
    try:
        tp = init_group(rank, world, port, device, load_kwargs.pop("expert_parallel"))
        engine = load_rank(tp=tp, **load_kwargs)
    except BaseException as e:  # report, then leave: rank 0 names this rank and the reason
        status.put((rank, "error", f"{type(e).__name__}: {e}" if not isinstance(e, EngineError) else str(e)))
        return
    status.put((rank, "ready", engine.fingerprint))
    try:
        serve(tp, engine.rank_commands())
        tp.close()
    except Exception:
        status.put((rank, "error", traceback.format_exc(limit=3)))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _exit_with_parent() -> None:
    """A worker whose rank 0 is gone leaves at once, even while its GPU waits in a collective (a one-shot
    kernel spinning on a dead peer's flag never returns to the host thread)."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="ddtree-tp-parent-watch").start()


class Workers:
    """The N-1 worker processes of a TP engine, owned by rank 0."""

    def __init__(self, world: int, device: str, load_kwargs: dict, load_rank: Callable[..., Rank]):
        """load_rank: a module-level function (the spawned processes import it by name)."""
        import torch.multiprocessing as mp

        self.world, self.port = world, _free_port()
        self.stopping = threading.Event()  # set before an orderly exit, so the watchdog stays quiet
        ctx = mp.get_context("spawn")
        self.status = ctx.Queue()
        self.procs = [ctx.Process(target=_worker_main, args=(r, world, self.port, device, load_rank, dict(load_kwargs), self.status),
                                  daemon=True, name=f"ddtree-tp-rank{r}") for r in range(1, world)]
        for p in self.procs:
            p.start()

    def wait_ready(self, fingerprint: str, timeout: float = 600.0) -> None:
        pending = set(range(1, self.world))
        deadline = time.monotonic() + timeout
        while pending:
            try:
                rank, kind, msg = self.status.get(timeout=0.5)
            except queue.Empty:
                self.check_alive()
                if time.monotonic() > deadline:
                    raise EngineError(f"tensor-parallel ranks {sorted(pending)} did not finish loading in {timeout:.0f}s.")
                continue
            if kind == "error":
                raise EngineError(f"tensor-parallel rank {rank} failed to load: {msg}")
            if msg != fingerprint:
                raise EngineError(f"tensor-parallel rank {rank} loaded a different checkpoint than rank 0.")
            pending.discard(rank)

    def check_alive(self) -> None:
        for r, p in enumerate(self.procs, start=1):
            if not p.is_alive():
                raise EngineError(f"tensor-parallel rank {r} died (exit code {p.exitcode}); restart ddtree-chat.")

    def failure_nowait(self) -> EngineError | None:
        """A reported error or a dead rank, if any, right now."""
        try:
            while True:
                rank, kind, msg = self.status.get_nowait()
                if kind == "error":
                    return EngineError(f"tensor-parallel rank {rank} failed: {msg.strip().splitlines()[-1]}")
        except queue.Empty:
            pass
        try:
            self.check_alive()
        except EngineError as e:
            return e
        return None

    def failure(self, wait: float = 2.0) -> EngineError | None:
        """After a collective failed: which rank is gone, and why (a dying rank may take a moment)."""
        deadline = time.monotonic() + wait
        while True:
            err = self.failure_nowait()
            if err is not None or time.monotonic() > deadline:
                return err
            time.sleep(0.05)

    def watch(self, on_death) -> None:
        """NCCL collectives wait forever on a dead peer (gloo raises at once), so rank 0 watches its
        workers from a thread and calls on_death(error) when one goes."""
        def loop():
            while not self.stopping.is_set():
                err = self.failure_nowait()
                if err is not None and not self.stopping.is_set():
                    on_death(err)
                    return
                time.sleep(0.5)

        threading.Thread(target=loop, daemon=True, name="ddtree-tp-watchdog").start()

    def shutdown(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        for p in self.procs:
            p.join(timeout)
            if p.is_alive():
                p.kill()
                p.join(2.0)


def join_group(workers: Workers, world: int, expert_parallel: bool, device: str) -> TPGroup:
    """Rank 0 joins the process group; a worker that dies first turns the wait into a clear error."""
    box: dict = {}

    def join():
        try:
            box["group"] = init_group(0, world, workers.port, device, expert_parallel)
        except BaseException as e:  # noqa: BLE001 - reported below
            box["error"] = e

    t = threading.Thread(target=join, daemon=True)
    t.start()
    while t.is_alive():
        t.join(0.2)
        if t.is_alive():
            err = workers.failure_nowait()
            if err is not None:
                raise err
    if "error" in box:
        raise EngineError(f"could not start the tensor-parallel group ({box['error']}).")
    return box["group"]


def abort_on_lost_rank(err: EngineError) -> None:
    """NCCL cannot be unblocked from Python: report the lost rank in one line and leave (never hang)."""
    logging.getLogger("ddtree_chat").error("%s", err)
    print(f"\nddtree-chat: {err}", file=sys.stderr, flush=True)
    os._exit(1)
