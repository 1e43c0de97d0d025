"""Tensor-parallel ranks on one machine: the group and its collectives, the per-tensor shard table,
and the worker processes (rank 0 lives in the app's own process).

Every rank runs the same round on the same inputs: rank 0 broadcasts each command (generate / logits /
stop / exit), the workers execute it, and per-round decisions (continue or stop) are broadcast too."""

from __future__ import annotations

import hashlib
import os
import queue
import signal
import socket
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from .errors import EngineError


@dataclass(frozen=True)
class TPGroup:
    rank: int = 0
    world: int = 1
    expert_parallel: bool = False  # routed experts split across ranks instead of along the intermediate dim

    def split(self, n: int, what: str) -> tuple[int, int]:
        """This rank's [start, end) of n evenly split items."""
        if n % self.world:
            raise EngineError(f"{what} ({n}) does not divide evenly over {self.world} tensor-parallel ranks; "
                              f"choose a --tp that divides it.")
        per = n // self.world
        return self.rank * per, (self.rank + 1) * per

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(x)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's x along the last axis (vocab-parallel logits)."""
        if self.world == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    def broadcast(self, obj):
        """Rank 0's obj on every rank."""
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]


SINGLE = TPGroup()


def shard_dim(name: str) -> int | None:
    """How a target tensor (checkpoint name minus prefix) is split under TP: 0 = rows (output features /
    heads / vocab), 1 = columns (input features), None = replicated."""
    if name in ("embed_tokens.weight", "lm_head.weight"):
        return 0
    if name.endswith(("self_attn.q_b_proj.weight", "self_attn.q_proj.weight", "self_attn.kv_b_proj.weight")):
        return 0
    if name.endswith("self_attn.o_proj.weight"):
        return 1
    if name.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight", "shared_experts.gate_proj.weight",
                      "shared_experts.up_proj.weight")):
        return 0
    if name.endswith(("mlp.down_proj.weight", "shared_experts.down_proj.weight")):
        return 1
    return None


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


def init_group(rank: int, world: int, port: int, backend: str, expert_parallel: bool) -> TPGroup:
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=int(os.environ.get("DDTREE_TP_TIMEOUT", "600"))))
    return TPGroup(rank, world, expert_parallel)


def _worker_main(rank: int, world: int, port: int, backend: str, load_kwargs: dict, status) -> None:
    # NOTE: Ctrl+C belongs to rank 0, which shuts the workers down in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from .engine import Engine

    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)  # NOTE: before the group exists, so NCCL binds this rank's GPU
        tp = init_group(rank, world, port, backend, load_kwargs.pop("expert_parallel"))
        engine = Engine._load_rank(tp=tp, **load_kwargs)
    except BaseException as e:  # report, then leave: rank 0 names this rank and the reason
        status.put((rank, "error", f"{type(e).__name__}: {e}" if not isinstance(e, EngineError) else str(e)))
        return
    status.put((rank, "ready", engine.fingerprint))
    try:
        engine.serve()
    except Exception:
        status.put((rank, "error", traceback.format_exc(limit=3)))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class Workers:
    """The N-1 worker processes of a TP engine, owned by rank 0."""

    def __init__(self, world: int, backend: str, load_kwargs: dict):
        import torch.multiprocessing as mp

        self.world, self.port = world, _free_port()
        self.stopping = threading.Event()  # set before an orderly exit, so the watchdog stays quiet
        ctx = mp.get_context("spawn")
        self.status = ctx.Queue()
        self.procs = [ctx.Process(target=_worker_main, args=(r, world, self.port, backend, dict(load_kwargs), self.status),
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
