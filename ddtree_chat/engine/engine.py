"""The public engine: load a target (+ optional DFlash drafter), score sequences, generate round events."""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist

from .config import load_target_config
from .budget import AutoBudget
from .ddtree import Decoder
from .errors import DeviceError, EngineError
from .generation import GenerationConfig, Stats
from .loader import Progress, load_drafter, load_target
from .memory import plan_memory, weight_bytes
from .model import causal_mask
from .ops.registry import prefer_library
from .parallel import SINGLE, TPGroup, Workers, checkpoint_fingerprint, init_group
from .tree import target_choice

log = logging.getLogger(__name__)


def default_dtype(cfg, dev: torch.device) -> torch.dtype:
    """float32 on CPU (the reference) and for small models on GPU (exact AR/tree agreement costs nothing
    there); bf16 for real checkpoints on GPU."""
    if dev.type != "cuda" or weight_bytes(cfg) < 2 * 1024**3:
        return torch.float32
    return torch.bfloat16


def _cpu_bf16_is_faster(cfg) -> bool:
    """Whether this CPU multiplies the drafter's lm-head shape faster in bf16 than in fp32 (CPUs with
    AVX512-BF16/AMX do; others can be several times slower), timed once in a few milliseconds."""
    x, w = torch.randn(8, cfg.hidden_size), torch.randn(min(cfg.vocab_size, 8192), cfg.hidden_size)

    def best(dt) -> float:
        a, b = x.to(dt), w.to(dt)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            a @ b.T
            times.append(time.perf_counter() - t0)
        return min(times[1:])

    return best(torch.bfloat16) < 0.8 * best(torch.float32)


def _pick_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError("--device cuda was asked for but no CUDA GPU is visible; use --device cpu.")
    if dev.type not in ("cpu", "cuda"):
        raise DeviceError(f"device {device!r} is not supported; use cpu or cuda.")
    return dev


def _machine(device: torch.device) -> str:
    """What the verify cost curve depends on besides the model: the GPU model and the kernels in use (a
    cached curve from another GPU, or from before a kernel landed, would mislead --budget auto)."""
    if device.type != "cuda":
        return str(device)
    from .ops import gpu

    return f"{torch.cuda.get_device_name(device).replace(' ', '_')}-k{gpu.fingerprint()}"


class Engine:
    def __init__(self, target, tcfg, tokenizer, drafter=None, dcfg=None, device=None, max_context: int = 4096,
                 tp: TPGroup = SINGLE, fingerprint: str = ""):
        self.target, self.tcfg, self.tokenizer = target, tcfg, tokenizer
        self.drafter, self.dcfg = drafter, dcfg
        self.device = device or next(target.parameters()).device
        self.decoder = Decoder(target, tcfg, drafter, dcfg, max_len=max_context)
        self.tp, self.fingerprint = tp, fingerprint
        self.workers: Workers | None = None
        self._broken: EngineError | None = None
        self._desynced = False  # a command was interrupted part-way: ranks may be out of step
        self._auto: AutoBudget | None = None
        self._lock = threading.RLock()  # one generation at a time (re-entrant: test drafters score with logits())

    @classmethod
    def load(cls, model_dir: str | Path, draft_dir: str | Path | None = None, device: str | None = None,
             tp: int | None = None, dtype: torch.dtype | str | None = None, progress: Progress = None,
             max_context: int | None = None, expert_parallel: bool = False, graphs: bool = True) -> "Engine":
        """Load on this process; with tp > 1 also start tp - 1 local worker ranks (gloo on CPU, NCCL on GPU).
        graphs: run rounds as CUDA graphs (one GPU only; `--eager` turns them off)."""
        dev = _pick_device(device)
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
        if dev.type == "cuda" and tp > torch.cuda.device_count():
            raise DeviceError(f"--tp {tp} needs {tp} GPUs but {torch.cuda.device_count()} are visible.")
        kwargs = dict(model_dir=str(model_dir), draft_dir=str(draft_dir) if draft_dir else None, device=str(dev),
                      dtype=dtype, max_context=max_context)
        if plan_for is not None:
            plan_for(tp).check()
        if tp == 1:
            engine = cls._load_rank(tp=SINGLE, progress=progress, **kwargs)
            if graphs and dev.type == "cuda":
                engine.use_graphs(progress=progress)
            return engine
        workers = Workers(tp, "nccl" if dev.type == "cuda" else "gloo", dict(kwargs, expert_parallel=expert_parallel))
        try:
            group = _join_group(workers, tp, expert_parallel, dev)
            engine = cls._load_rank(tp=group, progress=progress, **kwargs)
            workers.wait_ready(engine.fingerprint)
        except BaseException:
            workers.shutdown(timeout=0.1)
            if dist.is_initialized():
                dist.destroy_process_group()
            raise
        engine.workers = workers
        if dev.type == "cuda":
            workers.watch(_abort_on_lost_rank)
        atexit.register(engine.close)
        return engine

    @classmethod
    def _load_rank(cls, model_dir: str, draft_dir: str | None, device: str, dtype, max_context: int | None,
                   tp: TPGroup, progress: Progress = None) -> "Engine":
        from .tokenizer import load_tokenizer

        dev = torch.device(device if tp.world == 1 or torch.device(device).type == "cpu" else f"cuda:{tp.rank}")
        dtype = dtype or default_dtype(load_target_config(model_dir), dev)
        if dev.type == "cuda":
            # NOTE: cuBLAS's float32 heuristics pick ~50 us kernels for 8-row products of the demo's size
            # (tree verify, the drafter block); cuBLASLt's do not (BENCHMARKS.md). DDTREE_BLAS overrides.
            torch.backends.cuda.preferred_blas_library(
                os.environ.get("DDTREE_BLAS", "cublaslt" if dtype == torch.float32 else "cublas"))
        tokenizer = load_tokenizer(model_dir)
        try:
            tcfg, target = load_target(model_dir, dev, dtype, progress, tp)
            drafter = dcfg = None
            if draft_dir is not None:
                dcfg, drafter = load_drafter(draft_dir, tcfg, dev, dtype, progress)
                if dev.type == "cpu" and tp.world == 1 and dtype == torch.float32 and _cpu_bf16_is_faster(tcfg):
                    drafter = drafter.to(torch.bfloat16)  # NOTE: speed only; the target's choices stay fp32
                    drafter.reset_rope(dev)  # .to() also cast the float64 rope table
        except torch.OutOfMemoryError:
            raise DeviceError(f"the model does not fit in {dev} memory; use more GPUs (--tp) or a smaller model.") from None
        if tokenizer.vocab_size > tcfg.vocab_size:
            raise EngineError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model only {tcfg.vocab_size}.")
        if dev.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
            # NOTE: small models run many tiny ops; intra-op threads cost more than they give (and on a
            # loaded 2-core box OpenMP spinning made each op ~1000x slower).
            if sum(p.numel() for p in target.parameters()) < 200_000_000:
                torch.set_num_threads(1)
        ctx = max_context or min(tcfg.max_position_embeddings, 4096 if dev.type == "cpu" else 32768)
        return cls(target, tcfg, tokenizer, drafter, dcfg, dev, ctx, tp, checkpoint_fingerprint(model_dir, draft_dir))

    def use_graphs(self, capture: bool = True, progress: Progress = None) -> None:
        """A new executor of the round's programs (graphs.StaticRound), recording them as CUDA graphs when
        `capture`; records the AR, dflash and auto-budget rounds now (reported through `progress`). NOTE:
        one GPU only (collectives are not captured)."""
        from .generation import AUTO_BUDGETS
        from .graphs import StaticRound

        dec = self.decoder
        dec.graphs = StaticRound(dec, capture)
        rounds = [("ar", 0, False)]
        if self.drafter is not None:
            # NOTE: auto drafts each candidate both choosing (exploring rounds) and whole (the rest)
            rounds += [("dflash", self.dcfg.block_size - 1, False)] + [("ddtree", c, x) for c in AUTO_BUDGETS
                                                                       for x in (True, False)]
        try:
            with torch.no_grad():
                seconds = dec.graphs.warm(rounds, progress)
        except (RuntimeError, torch.OutOfMemoryError) as e:  # NOTE: an op that cannot be captured, or OOM
            log.warning("CUDA graphs unavailable, rounds run eagerly: %s", str(e).splitlines()[0][:200])
            dec.graphs.stop_recording()
            return
        log.info("recorded %d CUDA graphs in %.2f s", len(dec.graphs.graphs), seconds)

    # -- tensor parallel: rank 0 drives, workers follow ------------------------------------------
    def serve(self) -> None:
        """Worker ranks: execute rank 0's commands until told to exit."""
        while True:
            cmd = self.tp.broadcast(None)
            if cmd[0] == "exit":
                return
            try:
                if cmd[0] == "generate":
                    for _ in self._generate(cmd[1], cmd[2], None):
                        pass
                elif cmd[0] == "logits":
                    self._logits(cmd[1])
            except EngineError:
                pass  # NOTE: deterministic input errors happen on every rank; rank 0 reports them

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
            "modes": ["ddtree", "dflash", "ar"] if self.drafter is not None else ["ar"],
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
        """Yield one {"event": "round"} dict per round, then {"event": "done"}."""
        cfg = config or GenerationConfig()
        with self._lock:
            try:
                if self.tp.world > 1:
                    self._command("generate", list(token_ids), cfg)
                yield from self._generate(list(token_ids), cfg, stop)
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

    def _generate(self, ids: list[int], cfg: GenerationConfig, stop: threading.Event | None) -> Iterator[dict]:
        mode = cfg.mode if self.drafter is not None else "ar"
        auto = mode == "ddtree" and cfg.budget == "auto"
        budget = cfg.budget if mode == "ddtree" else (self.dcfg.block_size - 1 if mode == "dflash" else 0)
        stop_ids = frozenset(cfg.stop_token_ids if cfg.stop_token_ids is not None else self.tokenizer.stop_ids)
        gen = torch.Generator(device=self.device).manual_seed(cfg.seed)  # NOTE: samples stay on the device
        dec = self.decoder
        stats = Stats()
        detok = self.tokenizer.stream_decoder()
        out: list[int] = []
        t_start = time.perf_counter()
        logits = dec.prefill(ids, drafting=mode != "ar")
        t_costs = 0.0  # the one-time verify-cost measurement of --budget auto is not the prompt's time
        if auto:
            if self._auto is None:
                how = "graphs" if dec.graphs.capture else "eager"
                self._auto = AutoBudget(dec, self.tp, f"v4-{self.fingerprint[:16]}-{_machine(self.device)}-{dec.dtype}-"
                                                      f"tp{self.tp.world}-{how}")
            t0 = time.perf_counter()
            self._auto.ensure_costs()
            t_costs = time.perf_counter() - t0
        first = int(target_choice(logits[None], cfg.temperature, cfg.top_p, gen)[0])
        prompt_s = time.perf_counter() - t_start - t_costs  # NOTE: after int(): the device finished the prefill
        dec.pending = first
        out.append(first)
        stats.target_forwards += 1
        stats.generated += 1
        reason = "stop_token" if first in stop_ids else ("max_new_tokens" if cfg.max_new_tokens <= 1 else None)
        closing = False  # the consumer closed the generator: finish quietly, in step with the workers
        ev = {"event": "round", "prefill": True, "token_ids": [first], "text": _text(detok, [first], stop_ids),
              "accepted_length": 1, "tree": _EMPTY_TREE, "budget": cfg.budget if auto else budget, "mode": mode,
              "elapsed_s": time.perf_counter() - t_start}
        try:
            yield ev
        except GeneratorExit:
            closing = True
        while reason is None:
            halt = closing or (stop is not None and stop.is_set())
            if self.tp.world > 1:
                halt = self.tp.broadcast(halt)  # NOTE: rank 0 decides; every rank must run the same rounds
            if halt:
                reason = "stopped"
                break
            choose = then = None
            if auto:
                budget = self._auto.next_budget()  # NOTE: every round: the search moves it
                # NOTE: between exploring rounds the graph path verifies the last choice whole, so the
                # round is a fixed-size one and runs ahead; rounds run directly still cut it (a climbing CPU cost)
                if self._auto.exploring or not dec.runs_ahead(cfg.temperature):
                    choose = self._auto.choose
                then = self._auto.following
            room = dec.max_len - dec.cache.length
            if room < 1:
                reason = "context"
                break
            round_mode, round_budget = mode, budget
            if dec.round_room(mode, budget) > room:
                # NOTE: the context's last slots hold no tree or block: plain steps fill them (recorded at load,
                # unlike a tree cut to each remaining room)
                round_mode, round_budget, choose, then = "ar", 0, None, None
            t0 = time.perf_counter()
            r = dec.round(round_mode, round_budget, cfg.temperature, cfg.top_p, gen, stop_ids,
                          cfg.max_new_tokens - len(out), choose, then)
            if auto and round_mode == mode:
                self._auto.observe(r.tree, len(r.emitted), r.t_draft, r.t_target)
            out.extend(r.emitted)
            stats.target_forwards += 1
            stats.generated += len(r.emitted)
            stats.add_round(len(r.emitted))
            stats.time_draft += r.t_draft
            stats.time_target += r.t_target
            if r.emitted[-1] in stop_ids:
                reason = "stop_token"
            elif len(out) >= cfg.max_new_tokens:
                reason = "max_new_tokens"
            ev = {"event": "round", "token_ids": r.emitted, "text": _text(detok, r.emitted, stop_ids),
                  "accepted_length": len(r.emitted), "tree": dict(r.host_tree, accepted_nodes=r.path),
                  "budget": r.tree.size - 1 if round_mode == "ddtree" else round_budget, "auto_budget": auto,
                  "mode": round_mode,  # a context-filling round says "ar"; done keeps the reply's mode
                  "elapsed_s": time.perf_counter() - t0,
                  "draft_s": r.t_draft, "target_s": r.t_target}
            if not closing:
                try:
                    yield ev
                except GeneratorExit:
                    closing = True
        if closing:
            return
        elapsed = time.perf_counter() - t_start
        tail = detok.flush()
        yield {"event": "done", "token_ids": out, "text": self.tokenizer.decode([t for t in out if t not in stop_ids]), "tail_text": tail,
               "rounds": stats.rounds, "target_forwards": stats.target_forwards,
               "mean_accepted_length": stats.mean_accepted_length,
               "tokens_per_second": len(out) / elapsed if elapsed > 0 else 0.0, "stop_reason": reason,
               "acceptance_histogram": {str(k): v for k, v in sorted(stats.histogram.items())},
               "mode": mode, "budget": cfg.budget if auto else budget, "elapsed_s": elapsed,
               "draft_s": stats.time_draft, "target_s": stats.time_target,
               "prompt_tokens": len(ids), "prompt_s": prompt_s}


def _text(detok, ids: list[int], stop_ids: frozenset[int]) -> str:
    """Streamed text of the new ids; a stop token ends the reply and is not shown."""
    return "".join(detok.push(t) for t in ids if t not in stop_ids)


_EMPTY_TREE = {"tokens": [], "parents": [], "depth": [], "draft_logprobs": [], "target_tokens": [], "accepted_nodes": []}


def _abort_on_lost_rank(err: EngineError) -> None:
    """NCCL cannot be unblocked from Python: report the lost rank in one line and leave (never hang)."""
    import sys

    logging.getLogger("ddtree_chat").error("%s", err)
    print(f"\nddtree-chat: {err}", file=sys.stderr, flush=True)
    os._exit(1)


def _join_group(workers: Workers, world: int, expert_parallel: bool, dev: torch.device) -> TPGroup:
    """Rank 0 joins the process group; a worker that dies first turns the wait into a clear error."""
    box: dict = {}

    def join():
        try:
            box["group"] = init_group(0, world, workers.port, "nccl" if dev.type == "cuda" else "gloo", expert_parallel)
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
