"""The public engine: load a target (+ optional DFlash drafter), score sequences, generate a reply's events.
Rank 0 of a tensor-parallel engine drives its workers (parallel/) with broadcast commands."""

from __future__ import annotations

import atexit
import logging
import threading
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist

from .. import knobs
from ..modes import Mode
from . import device_policy
from .config import load_target_config
from .ddtree import Decoder
from .errors import DeviceError, EngineError
from .events import DoneEvent, RoundEvent
from .generation import AUTO_BUDGETS, GenerationConfig
from .loader import load_drafter, load_target
from .memory import check_host_memory, host_available, plan_memory
from .model import causal_mask
from .ops import build
from .ops.registry import prefer_library
from .parallel import SINGLE, TPGroup, Workers, abort_on_lost_rank, checkpoint_fingerprint, join_group, rank_device
from .progress import Progress
from .reply import ReplyLoop

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, target, tcfg, tokenizer, drafter=None, dcfg=None, device=None, max_context: int = 4096,
                 tp: TPGroup = SINGLE, fingerprint: str = ""):
        self.target, self.tcfg, self.tokenizer = target, tcfg, tokenizer
        self.drafter, self.dcfg = drafter, dcfg
        self.device = device or next(target.parameters()).device
        self.decoder = Decoder(target, tcfg, drafter, dcfg, max_len=max_context)
        self.tp, self.fingerprint = tp, fingerprint
        self.replies = ReplyLoop(self.decoder, tokenizer, tp, self.device, self._cost_key)
        self.workers: Workers | None = None
        self._broken: EngineError | None = None
        self._desynced = False  # a command was interrupted part-way: ranks may be out of step
        self._lock = threading.RLock()  # one generation at a time (re-entrant: test drafters score with logits())

    @classmethod
    def load(cls, model_dir: str | Path, draft_dir: str | Path | None = None, device: str | None = None,
             tp: int | None = None, dtype: torch.dtype | str | None = None, progress: Progress = None,
             max_context: int | None = None, expert_parallel: bool = False, graphs: bool = True) -> "Engine":
        """Load on this process; with tp > 1 also start tp - 1 local worker ranks (gloo on CPU; on GPUs the
        one-shot collectives or NCCL, parallel/group.py). graphs: run rounds as CUDA graphs on GPUs, on every
        rank (`--eager` turns them off)."""
        dev = device_policy.pick_device(device)
        if isinstance(dtype, str):  # "auto" | "float32" | "bfloat16" (the CLI's --dtype)
            dtype = None if dtype == "auto" else getattr(torch, dtype)
        plan_for = None  # world size -> MemoryPlan, on GPUs
        if dev.type == "cuda":
            cfg, gpu_bytes = load_target_config(model_dir), torch.cuda.get_device_properties(0).total_memory
            plan_for = lambda world: plan_memory(cfg, world, gpu_bytes, max_context or 4096, expert_parallel)  # noqa: E731
        if tp is None:
            # NOTE: all visible GPUs, unless one GPU holds the model (the demo pair on an 8-GPU box would
            # otherwise be split 8 ways, which its 4 heads cannot be).
            tp = torch.cuda.device_count() if plan_for is not None and not plan_for(1).fits else 1
        if tp < 1:
            raise EngineError("--tp must be at least 1.")
        shared_gpu = dev.type == "cuda" and knobs.tp_one_gpu()  # a test configuration: every rank on GPU 0
        if dev.type == "cuda" and tp > torch.cuda.device_count() and not shared_gpu:
            raise DeviceError(f"--tp {tp} needs {tp} GPUs but {torch.cuda.device_count()} are visible.")
        kwargs = dict(model_dir=str(model_dir), draft_dir=str(draft_dir) if draft_dir else None, device=str(dev),
                      dtype=dtype, max_context=max_context)
        if plan_for is not None and not shared_gpu:
            plan_for(tp).check()
        if dev.type == "cpu":
            cfg = load_target_config(model_dir)
            elem = (dtype or device_policy.default_dtype(cfg, dev)).itemsize
            check_host_memory(cfg, tp, elem, host_available())
        if tp == 1:
            engine = cls._load_rank(tp=SINGLE, progress=progress, **kwargs)
            if graphs and dev.type == "cuda":
                engine.use_graphs(progress=progress)
            return engine
        workers = Workers(tp, str(dev), dict(kwargs, expert_parallel=expert_parallel), load_worker_rank)
        try:
            group = join_group(workers, tp, expert_parallel, str(dev))
            engine = cls._load_rank(tp=group, progress=progress, **kwargs)
            workers.wait_ready(engine.fingerprint)
            engine.workers = workers
            if dev.type == "cuda":
                workers.watch(abort_on_lost_rank)
                if graphs:
                    engine._command("use_graphs")  # NOTE: every rank records the same programs, in step
                    engine.use_graphs(progress=progress)
        except BaseException:
            workers.shutdown(timeout=0.1)
            if dist.is_initialized():
                dist.destroy_process_group()
            raise
        atexit.register(engine.close)
        return engine

    @classmethod
    def _load_rank(cls, model_dir: str, draft_dir: str | None, device: str, dtype, max_context: int | None,
                   tp: TPGroup, progress: Progress = None) -> "Engine":
        from .tokenizer import load_tokenizer

        dev = torch.device(device) if tp.world == 1 else rank_device(device, tp.rank)
        dtype = dtype or device_policy.default_dtype(load_target_config(model_dir), dev)
        if dev.type == "cuda":
            device_policy.prefer_blas(dtype)
            if knobs.get(knobs.KERNELS) != "0":
                build.build_in_background()  # NOTE: a first start's nvcc runs while the checkpoint loads
        tokenizer = load_tokenizer(model_dir)
        try:
            tcfg, target = load_target(model_dir, dev, dtype, progress, tp)
            drafter = dcfg = None
            if draft_dir is not None:
                dcfg, drafter = load_drafter(draft_dir, tcfg, dev, dtype, progress, tp)
                if dev.type == "cpu" and tp.world == 1 and dtype == torch.float32 and device_policy.cpu_bf16_is_faster(tcfg):
                    drafter = drafter.to(torch.bfloat16)  # NOTE: speed only; the target's choices stay fp32
                    drafter.reset_rope(dev)  # .to() also cast the float64 rope table
        except torch.OutOfMemoryError:
            raise DeviceError(f"the model does not fit in {dev} memory; use more GPUs (--tp) or a smaller model.") from None
        if tokenizer.vocab_size > tcfg.vocab_size:
            raise EngineError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model only {tcfg.vocab_size}.")
        if dev.type == "cpu":
            device_policy.limit_cpu_threads(target)
        ctx = max_context or min(tcfg.max_position_embeddings, 4096 if dev.type == "cpu" else 32768)
        engine = cls(target, tcfg, tokenizer, drafter, dcfg, dev, ctx, tp, checkpoint_fingerprint(model_dir, draft_dir))
        if dev.type == "cpu":  # NOTE: after the Decoder made the drafter's copy of the lm head
            device_policy.pack_cpu_products(engine.decoder)
        return engine

    def use_graphs(self, capture: bool = True, progress: Progress = None) -> None:
        """A new executor of the round's programs (graphs.StaticRound), recording them as CUDA graphs when
        `capture`; records the AR, dflash and auto-budget rounds now (reported through `progress`). Under
        TP every rank records, and all keep graphs only if all could (they must run the same programs)."""
        from .graphs import StaticRound

        dec = self.decoder
        dec.graphs = StaticRound(dec, capture)
        rounds = [(*dec.shape(Mode.AR, 0), False)]
        if self.drafter is not None:
            # NOTE: auto drafts each candidate both choosing (exploring rounds) and whole (the rest)
            rounds += [(*dec.shape(Mode.DFLASH, 0), False)] + [(Mode.DDTREE, c, x) for c in AUTO_BUDGETS
                                                                for x in (True, False)]
        try:
            with torch.no_grad():
                seconds = dec.graphs.warm(rounds, progress)
        except (RuntimeError, torch.OutOfMemoryError) as e:  # NOTE: an op that cannot be captured, or OOM
            log.warning("CUDA graphs unavailable, rounds run eagerly: %s", str(e).splitlines()[0][:200])
            dec.graphs.stop_recording()
        if not all(self.tp.gather_objects(dec.graphs.capture)):
            dec.graphs.stop_recording()
            return
        log.info("recorded %d CUDA graphs in %.2f s", len(dec.graphs.graphs), seconds)

    # -- tensor parallel: rank 0 drives, workers follow ------------------------------------------
    def rank_commands(self) -> dict:
        """What a worker rank runs for each command rank 0 broadcasts (parallel.serve)."""
        return {"generate": lambda ids, cfg: all(True for _ in self.replies.run(ids, cfg, None)),
                "logits": self._logits, "use_graphs": self.use_graphs}

    def _command(self, *cmd) -> None:
        if self._broken is not None:
            raise self._broken
        if self.workers is not None:
            self.workers.check_alive()
        self.tp.broadcast(cmd)

    def _lost_rank(self, err: RuntimeError) -> EngineError:
        self._broken = (self.workers.failure() if self.workers else None) or \
            EngineError(f"a tensor-parallel collective failed ({str(err).splitlines()[0][:160]}); restart ddtree-chat.")
        return self._broken

    def close(self) -> None:
        """Shut the worker ranks down (idempotent)."""
        if self.workers is None:
            return
        workers, self.workers = self.workers, None
        workers.stopping.set()
        # NOTE: only ranks known to be in step (idle, between commands) can be asked to exit; otherwise a
        # broadcast could pair with a collective the workers are still waiting in, so they are killed.
        in_step = self._broken is None and not self._desynced and self._lock.acquire(timeout=1.0)
        if in_step:
            try:
                self.tp.broadcast(("exit",))
                self.tp.close()
            except RuntimeError:
                in_step = False
            finally:
                self._lock.release()
        workers.shutdown(timeout=5.0 if in_step else 0.0)
        if dist.is_initialized():
            dist.destroy_process_group()

    @property
    def info(self) -> dict:
        return {
            "model": self.tcfg.name,
            "device": str(self.device),
            "tp": self.tp.world,
            "has_drafter": self.drafter is not None,
            "max_context": self.decoder.max_len,
            "modes": list(Mode) if self.drafter is not None else [Mode.AR],
            "block_size": self.dcfg.block_size if self.dcfg else None,
            "cuda_graphs": len(self.decoder.graphs.graphs),
            "graph_capture_s": round(self.decoder.graphs.capture_s, 3),
        }

    def logits(self, token_ids: list[int]) -> torch.Tensor:
        """The target's float32 logits [len, vocab] for a full sequence, without any cache."""
        with self._lock:
            try:
                if self.tp.world > 1:
                    self._command("logits", list(token_ids))
                return self._logits(token_ids)
            except RuntimeError as e:
                self._desynced = True
                if self.tp.world > 1:
                    raise self._lost_rank(e) from None
                raise
            except BaseException:
                self._desynced = True
                raise

    @torch.no_grad()
    def _logits(self, token_ids: list[int]) -> torch.Tensor:
        t = len(token_ids)
        ids = torch.tensor(token_ids, device=self.device)
        with prefer_library():
            hidden, _ = self.target(ids, torch.arange(t, device=self.device), causal_mask(t, self.device))
            return self.target.logits(hidden)

    def generate(self, token_ids: list[int], config: GenerationConfig | None = None,
                 stop: threading.Event | None = None) -> Iterator[dict]:
        """Yield one {"event": "round"} dict per round, then {"event": "done"} (events' to_json())."""
        events = self.events(token_ids, config, stop)
        try:
            for ev in events:
                yield ev.to_json()
        finally:
            events.close()  # NOTE: now, not at garbage collection: the reply winds down in step with the workers

    def events(self, token_ids: list[int], config: GenerationConfig | None = None,
               stop: threading.Event | None = None) -> Iterator[RoundEvent | DoneEvent]:
        """The reply's typed events: a RoundEvent per round (the first for the prompt's token), then a DoneEvent."""
        cfg = config or GenerationConfig()
        with self._lock:
            try:
                if self.tp.world > 1:
                    self._command("generate", list(token_ids), cfg)
                yield from self.replies.run(list(token_ids), cfg, stop)
            except EngineError:
                raise  # NOTE: input errors happen identically on every rank: still in step
            except torch.OutOfMemoryError:
                self._desynced = True
                raise DeviceError("the GPU ran out of memory during generation; lower --context or --budget.") from None
            except RuntimeError as e:
                self._desynced = True
                if self.tp.world > 1:
                    raise self._lost_rank(e) from None
                raise
            except BaseException:  # e.g. Ctrl+C in the middle of a collective
                self._desynced = True
                raise

    def _cost_key(self) -> str:
        """The verify cost curve's cache key: checkpoint, machine, dtype, ranks, and how rounds run. NOTE: v7 since
        the CPU's verifies got cheaper (oneDNN products, dense experts): an older curve would keep auto's trees small."""
        dec = self.decoder
        how = "graphs" if dec.graphs.capture else "eager"
        return f"v7-{self.fingerprint[:16]}-{device_policy.machine(self.device)}-{dec.dtype}-tp{self.tp.world}-{how}"

def load_worker_rank(**kwargs) -> Engine:
    """A tensor-parallel worker's rank (parallel.Workers imports this by name in each worker process)."""
    return Engine._load_rank(**kwargs)
