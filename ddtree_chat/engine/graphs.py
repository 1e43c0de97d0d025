"""The round as static-shape programs over explicit buffers and caches, and their executor: draft
(drafter + tree build), verify (target over the tree + greedy choice), accept (verify walk, KV compaction
of the path, drafter context update, packing), and prefill chunks for a prompt. The executor runs a
program directly (CPU, `--eager`, tensor parallel, shapes not recorded) or, recording (one GPU), records
it once as a CUDA graph per shape and replays it: a Python-launched demo forward costs many times its
kernels' time in host time (BENCHMARKS.md, the prefill-chunk rows; docs/architecture.md).

NOTE: the host stays the owner of every length. Before a round it writes (committed length, drafter
entries, root token) into one device buffer that the programs read, so a graph replays at any length;
after it, the one copy of the packed result tells the host how many rows to count. Rows the programs
write past the committed lengths are scratch. Not recording (CPU, --eager, tensor parallel), the same
programs run directly.

NOTE: recording a program runs it once (the warm-up before the capture); _record puts back every buffer
that run wrote, so a recording never moves the state a later round reads. The graphs share one memory
pool, so a program's outputs are valid only until another program runs: what the host reads later (the
prompt's logits, read after the auto budget's timing replays) is copied into a buffer of this class."""

from __future__ import annotations

import logging
import time
from typing import NamedTuple, Union

import torch

from .. import knobs
from ..modes import MAX_BUDGET, REPEAT_WINDOW, Mode
from .generation import AUTO_BUDGETS, RoundShape
from .model import causal_mask
from .ops.registry import prefer_library
from .progress import Stage
from .repeat import repeat_penalize
from .sampling import sample
from .tree import DraftTree, pack_round, path_scores, walk_commit

log = logging.getLogger(__name__)
MAX_NODES = MAX_BUDGET + 1  # tree nodes a round may have (root included)
MAX_RECORDED = 257  # tree sizes recorded as graphs (budget <= 256); larger trees run directly
MIN_SPAN = 256  # cache slots the smallest recording attends (then doubling up to the cache's capacity)
PREFILL_SIZES = (16, 64, 256)  # prompt chunk rows recorded; a chunk's rows past its tokens are scratch
PRECOMPILE_PASSES = 4  # discovery rounds of a first start (an op's n-th kernel shows in the n-th)


# One key per program and shape: a recorded graph, or a program run directly, is looked up by it. Each
# starts with its program's name, so keys of different programs never compare equal.
class PrefillKey(NamedTuple):
    program: str  # "prefill"
    rows: int  # the chunk's rows (a recorded size, or the prompt tokens it runs)
    drafting: bool  # also writes the drafter's context rows


class DraftKey(NamedTuple):
    program: str  # "draft"
    mode: Mode
    budget: int
    span: int  # drafter context slots attended (a power of two covering its entries)
    choosing: bool  # computes the auto budget's cumulative path mass


class VerifyKey(NamedTuple):
    program: str  # "verify"
    nodes: int  # tree nodes, root included
    features: bool  # keeps the target features the drafter's context is made of
    penalty: bool = False  # applies the repeat penalty (self.penalty) to each node's logits before its choice
    sampled: str = ""  # the choice: "" the argmax, else a draw (sampling.kind) with this reply's values on the device
    span: int = 0  # target cache slots its attention plans for (StaticRound.target_span; 0: the whole cache)


class AcceptKey(NamedTuple):
    program: str  # "accept"
    nodes: int
    drafting: bool  # extends the drafter's context
    chain: bool  # node i at depth i (ar, dflash): the accepted path is in place already
    keep: bool = False  # a plain step that keeps its root's target features (Decoder.kept) for a later catch-up
    penalty: bool = False  # commits the accepted tokens to the repeat penalty's window (Decoder.recent)
    sampled: str = ""  # its verify's (whose features it reads)
    span: int = 0  # its verify's


class Variant(NamedTuple):
    """What a reply's settings change in its rounds' verify and accept programs (each combination is recorded apart)."""
    penalty: bool = False  # the repeat penalty
    sampled: str = ""  # sampling.kind(temperature, top_p)


GraphKey = Union[PrefillKey, DraftKey, VerifyKey, AcceptKey]
_KEYS = {"prefill": PrefillKey, "draft": DraftKey, "verify": VerifyKey, "accept": AcceptKey}


def graph_key(key: tuple) -> GraphKey:
    """The typed key of a plain tuple written as one (program name first)."""
    return key if hasattr(key, "program") else _KEYS[key[0]](*key)


class SlotView:
    """The LatentCache a static forward sees: the committed length and the write slots live on the device;
    span > 0: only the cache's first `span` slots (the attention's plan is sized by the buffer it is given)."""

    def __init__(self, cache, length: torch.Tensor, slots: torch.Tensor, span: int = 0):
        self.cache, self.length, self.slots = cache, length, slots
        self.rows = slice(0, span or cache.ckv.shape[1])

    def destination(self, layer: int, t: int):
        return self.cache.ckv[layer, self.rows], self.cache.kpe[layer, self.rows], self.slots


class _Clock:
    """Draft / target split of a round: CUDA events on the GPU (read after the round's sync), else host time."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks = [self._now()]

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def mark(self) -> None:
        self.marks.append(self._now())

    def seconds(self) -> float:
        """From the first mark to the last; call after the work they enclose has finished."""
        a, b = self.marks[0], self.marks[-1]
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a

    def split(self) -> tuple[float, float]:
        """(draft, target) seconds; call after the round's result arrived (marks: start, verify, end; or start,
        drafted, verify, end: a budget choice between the draft and the verify, its host time in neither)."""
        a, b, c, d = self.marks if len(self.marks) == 4 else (*self.marks[:2], *self.marks[1:])
        if self.cuda:
            return a.elapsed_time(b) / 1e3, c.elapsed_time(d) / 1e3
        return b - a, d - c


class Flight:
    """A launched round whose packed result is on its way to the host (an event marks its arrival)."""

    def __init__(self, key: RoundShape, n: int, host: torch.Tensor, event, clock: _Clock):
        self.key, self.n, self.host, self.event, self.clock = key, n, host, event, clock

    def wait(self) -> torch.Tensor:
        if self.event is not None:
            self.event.synchronize()
        return self.host


class StaticRound:
    """The round's programs over static buffers; with capture=True each is a CUDA graph."""

    def __init__(self, dec, capture: bool):
        self.dec, self.capture = dec, capture
        dev, n = dec.device, MAX_NODES
        long = dict(dtype=torch.long, device=dev)
        # committed length, drafter entries, root token; then the block's mask tokens, so that the draft's
        # block [root, mask, ...] is a view (no concatenation per round)
        block = dec.block if dec.dcfg else 1
        self._state_block = torch.zeros(2 + block, **long)
        if dec.dcfg:
            self._state_block[3:] = dec.dcfg.mask_token_id
        self.state = self._state_block[:3]
        self._host = torch.zeros(3, dtype=torch.long, pin_memory=dev.type == "cuda")
        self.tokens, self.depth, self.choice = (torch.zeros(n, **long) for _ in range(3))
        self.parents = torch.full((n,), -1, **long)  # NOTE: node 0 keeps parent -1, depth 0, log-prob 0
        self.prompt = torch.zeros(PREFILL_SIZES[-1], **long)  # a prefill chunk's tokens ...
        self.last = torch.zeros(1, **long)  # ... and the row whose logits it returns
        self._causal: dict[int, torch.Tensor] = {}
        self.logprobs = torch.zeros(n, dtype=torch.float32, device=dev)
        # the reply's settings the recorded verifies read (written by use())
        self.penalty, self.temperature, self.top_p = (torch.ones(1, dtype=torch.float32, device=dev) for _ in range(3))
        self.seed = torch.zeros((), **long)
        self._values = {"penalty": 1.0, "temperature": 1.0, "top_p": 1.0, "seed": 0}
        self.cum_mass = torch.zeros(n, dtype=torch.float32, device=dev)  # the auto budget's gain curve
        self.block = dec.block
        cap = dec.dcache.capacity if dec.dcache is not None else 0
        self.arange = torch.arange(max(n, cap, self.block), **long)
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.pads_prefill = capture  # prompt chunks padded to the recorded sizes (tests set it on the CPU)
        self.graphs: dict[tuple, tuple] = {}  # key -> (CUDAGraph, static outputs)
        self.outputs: dict[tuple, object] = {}  # key -> last outputs (the graph's static ones when captured)
        self.capture_s = 0.0
        self.warmed: list[tuple[str, int, bool]] = []  # the rounds warm() recorded
        self.variants = {Variant()}  # the variants their programs are recorded in (Decoder.record_variant)
        self._pinned: dict[int, list[torch.Tensor]] = {}
        self.prompt_logits: torch.Tensor | None = None  # [1, V]: made by the first prefill run, outside any capture
        # the buffers a program writes besides the caches (restored after a recording's warm-up run)
        self._written = (self._state_block, self.tokens, self.parents, self.depth, self.choice, self.logprobs,
                         self.cum_mass, dec.recent.ring)

    # -- which rounds, which programs ----------------------------------------------------------------
    def fits(self, mode: Mode, budget: int) -> bool:
        """Whether this round's nodes fit the context (and, drafting, its block the drafter's window)."""
        n = self.dec.shape(mode, budget).nodes
        return n <= self.dec.max_len and (n == 1 or self.dec.dcache.capacity >= self.block)

    def recordable(self, key: tuple) -> bool:
        """Recorded: prefill chunks of the recorded sizes, rounds of at most MAX_RECORDED nodes (a larger
        graph would hold a large share of the pool for rare budgets)."""
        if not self.capture:
            return False
        key = graph_key(key)
        if key.program == "prefill":
            return key.rows in PREFILL_SIZES
        return (self.dec.shape(key.mode, key.budget).nodes if key.program == "draft" else key.nodes) <= MAX_RECORDED

    def plan(self, mode: Mode, budget: int, choosing: bool) -> tuple[int, list[int]]:
        """(nodes drafted, root included; the tree sizes this round may verify)."""
        n = self.dec.shape(mode, budget).nodes
        if n == 1 or not choosing:
            return n, [n]
        return n, [c + 1 for c in AUTO_BUDGETS if c + 1 <= n]  # NOTE: the auto budget cuts to a candidate size

    def draft_key(self, mode: Mode, budget: int, choosing: bool = False, held: int | None = None) -> DraftKey:
        """NOTE: the draft attends a power-of-two span of the drafter cache that covers its entries, not
        the whole buffer: reading (and reducing over) 32k empty slots per round cost more than the rest.
        Only a draft for the auto budget (choosing) computes the cumulative path mass. held: the drafter
        entries to cover (default: those the host counts now)."""
        held = self.dec.dcache.length if held is None else held
        span = MIN_SPAN
        while span < held:
            span *= 2
        return DraftKey("draft", mode, budget, min(span, self.dec.dcache.capacity), choosing)

    def target_span(self, rows: int) -> int:
        """NOTE: a verify's attention plans for a power-of-two span of the target cache that covers the rows
        it may read and write, not the whole buffer: a tree's row-invariant attention planned for a 32k-slot
        cache took ~2x its time planned for the prefix (BENCHMARKS.md). That attention splits keys at fixed
        positions, so every span gives the same bits. 0: the whole cache."""
        span = MIN_SPAN
        while span < rows:
            span *= 2
        return 0 if span >= self.dec.max_len else span

    def drafting(self, mode: Mode) -> bool:
        return mode != Mode.AR and self.dec.drafter is not None

    def verify_key(self, mode: Mode, n: int, keep: bool = False, variant: Variant = Variant(),
                   upto: int | None = None) -> VerifyKey:
        """Only a drafting round's verify, or a plain step that keeps them, has the target features the
        drafter's context is made of. upto: the cache rows the round may reach (default: the host's committed
        length + n; a round launched ahead passes a bound)."""
        upto = self.dec.cache.length + n if upto is None else upto
        return VerifyKey("verify", n, self.drafting(mode) or keep, *variant, self.target_span(upto))

    def accept_key(self, mode: Mode, n: int, keep: bool = False, variant: Variant = Variant(),
                   upto: int | None = None) -> AcceptKey:
        """An `ar` round's accept leaves the drafter's context alone (plain decoding pays nothing for it; the
        auto budget's plain steps keep their features: `keep`); an `ar` or `dflash` round's nodes are a chain,
        so its accepted path is already in place. It reads the features of its verify (same span)."""
        drafting = self.drafting(mode)
        span = self.verify_key(mode, n, keep, variant, upto).span
        return AcceptKey("accept", n, drafting, mode != Mode.DDTREE or n == 1, keep and not drafting, *variant, span)

    def round_keys(self, mode: Mode, budget: int, sizes: list[int], choosing: bool, held: int | None = None,
                   keep: bool = False, variant: Variant = Variant(), upto: int | None = None):
        """held, upto: bounds for a round launched ahead (draft_key's, and the target cache rows its verify of
        the largest size may reach)."""
        if sizes != [1]:
            yield self.draft_key(mode, budget, choosing, held)
        for n in sizes:
            yield self.verify_key(mode, n, keep, variant, upto)
            yield self.accept_key(mode, n, keep, variant, upto)

    def prefill_sizes(self, drafting: bool) -> list[int]:
        """Chunk sizes that fit the target cache (and, drafting, the drafter's window) whole."""
        cap = self.dec.dcache.capacity if drafting else self.dec.max_len  # NOTE: capacity <= max_len
        return [s for s in PREFILL_SIZES if s <= cap]

    def _program(self, key: tuple):
        key = graph_key(key)
        if key.program == "prefill":
            return lambda: self.prefill(key.rows, key.drafting)
        if key.program == "draft":
            return lambda: self.draft(key.mode, key.budget, key.span, key.choosing)
        if key.program == "verify":
            return lambda: self.verify(key.nodes, key.features, Variant(key.penalty, key.sampled), key.span)
        feats = lambda: (self.outputs[VerifyKey("verify", key.nodes, True, key.penalty, key.sampled, key.span)]  # noqa: E731
                         if key.drafting or key.keep else None)
        return lambda: self.accept(key.nodes, feats(), key.chain, key.keep, key.penalty)

    def prepare(self, keys) -> None:
        """Record the programs of these keys that are recordable and not recorded yet (a recording leaves
        the device state as it was)."""
        for key in map(graph_key, keys):
            if key not in self.graphs and self.recordable(key):
                try:
                    self.graphs[key] = self._record(key)
                except RuntimeError as e:
                    raise RuntimeError(f"recording {key}: {e}") from e
                self.outputs[key] = self.graphs[key][1]

    def stop_recording(self) -> None:
        """From now on every program runs directly (a program could not be recorded)."""
        cuda = self.dec.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.dec.device)  # NOTE: no replay in flight while its graph goes
        self.capture = self.pads_prefill = False
        self.graphs.clear()
        self.outputs.clear()
        if cuda:
            torch.cuda.empty_cache()

    def warm(self, modes: list[tuple[str, int, bool]], progress=None) -> float:
        """Record every program of these (mode, budget, choosing) rounds and the prefill chunks now; returns
        the seconds spent. progress(done, total, Stage.COMPILING) per kernel a first start compiles, then
        progress(done, total, Stage.RECORDING) after each round's programs and each prefill variant's."""
        before = self.capture_s
        self.warmed = modes  # NOTE: variant_keys() names their programs again, in another variant
        variants = [False] + ([True] if self.dec.dcache is not None else [])
        # one group of programs per round, then one per prefill variant: recorded, and reported, group by group
        groups = self._round_groups(modes, Variant())
        groups += [[PrefillKey("prefill", n, d) for n in self.prefill_sizes(d)] for d in variants]
        self._precompile([k for g in groups for k in g], progress)
        for i, keys in enumerate(groups):
            self.prepare(keys)
            if progress:
                progress(i + 1, len(groups), Stage.RECORDING)
        return self.capture_s - before

    def _round_groups(self, modes: list[tuple[str, int, bool]], variant: Variant) -> list[list]:
        """The programs of each of these (mode, budget, choosing) rounds, a list per round (read twice), and of
        the auto budget's plain steps when a choosing tree round is among them."""
        groups = [list(self.round_keys(mode, budget, self.plan(mode, budget, choosing)[1], choosing, variant=variant))
                  for mode, budget, choosing in modes if self.fits(mode, budget)]
        if self.dec.dcache is not None and any(m is Mode.DDTREE and c for m, _, c in modes):
            groups.append(list(self.round_keys(Mode.AR, 0, [1], False, keep=True, variant=variant)))
        return groups

    def variant_keys(self, variant: Variant) -> list:
        """The warmed rounds' programs in this variant: a reply that uses it records them all before its prefill
        (on first use they fell inside replies, one recording a new shape, and the auto budget's timing)."""
        return [k for g in self._round_groups(self.warmed, variant) for k in g]

    def _precompile(self, keys, progress=None) -> None:
        """Before recording (the first start): run each program once with its new Triton kernels recorded
        instead of compiled (their ops served by the reference), each handed as it is found to the compile pool
        (ops/precompile.py), which works while discovery goes on; the recording then finds them compiled. An op
        launching kernels one after another shows its later ones only once its first are compiled (the first
        skipped launch hands the op to its reference), so discovery repeats until it finds nothing new. Leaves
        the device state as it was. One GPU only: under tensor parallelism the recording compiles one by one."""
        keys = [k for k in dict.fromkeys(map(graph_key, keys)) if k not in self.graphs and self.recordable(k)]
        how = knobs.get(knobs.PRECOMPILE)
        if not keys or self.dec.device.type != "cuda" or how == "0":
            return
        if self.dec.target.tp.world > 1:  # NOTE: ranks with different kernels in memory would skip different
            return  # launches: a collective launched by one rank alone waits forever
        from .ops import precompile

        t0 = time.perf_counter()
        report = (lambda done, total: progress(done, total, Stage.COMPILING)) if progress else None
        with precompile.Pool(self.dec.device, report=report, processes=how == "1") as pool:
            for i in range(PRECOMPILE_PASSES):
                t, before = time.perf_counter(), pool.submitted
                took = self._discover(keys, precompile, pool.submit)
                if took is None:
                    break
                found = time.perf_counter() - t
                pool.wait()
                slowest = ", ".join(" ".join(str(getattr(v, "value", v)) for v in k) + f" {s:.1f} s"
                                    for s, k in sorted(took, key=lambda x: -x[0])[:3])
                log.info("precompile pass %d: %d new kernels, discovery %.1f s (slowest: %s), compiled %.1f s later",
                         i + 1, pool.submitted - before, found, slowest, time.perf_counter() - t - found)
                if pool.submitted == before:
                    break
        self.capture_s += time.perf_counter() - t0
        log.info("precompiled %d of %d Triton kernels in %.1f s, %d by worker processes (%s)", pool.compiled,
                 pool.submitted, time.perf_counter() - t0, pool.elsewhere,
                 ", ".join(f"{n} x{c}" for n, c in pool.names.most_common()))

    def _discover(self, keys, precompile, start) -> list[tuple[float, GraphKey]] | None:
        """Run each program once under precompile.discovery(start): start(kernel, spec) for each Triton kernel
        it would compile now. Returns each program's host seconds, or None when this Triton has no compile hook."""
        outputs, took = dict(self.outputs), []
        try:
            with precompile.discovery(start):
                for key in keys:
                    saved = self._save_for_warm_up(0 if key.program == "draft" else key[1],
                                                   key.span if key.program in ("verify", "accept") else 0)
                    t = time.perf_counter()
                    try:
                        self.outputs[key] = self._program(key)()  # NOTE: an accept reads its verify's outputs
                    except Exception as e:  # noqa: BLE001 - e.g. a new kernel outside the registry
                        log.debug("precompile: %s stopped early (%s): the recording compiles the rest", key, e)
                    finally:
                        took.append((time.perf_counter() - t, key))
                        self._restore(saved)
        except (ImportError, AttributeError) as e:  # NOTE: a Triton without the compile hook: one by one, as before
            log.info("no parallel precompile (%s)", e)
            return None
        finally:
            torch.cuda.synchronize(self.dec.device)
            self.outputs.clear()
            self.outputs.update(outputs)
        return took

    def _record(self, key: GraphKey):
        t0 = time.perf_counter()
        fn = self._program(key)
        # a prefill's rows, a tree's nodes, within its verify's span
        saved = self._save_for_warm_up(0 if key.program == "draft" else key[1],
                                       key.span if key.program in ("verify", "accept") else 0)
        side = torch.cuda.Stream(self.dec.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()  # NOTE: warm-up outside the graph: autotuning, lazy builds, library handles
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn()
        self._restore(saved)
        torch.cuda.synchronize(self.dec.device)
        self.capture_s += time.perf_counter() - t0
        return graph, out

    def _save_for_warm_up(self, rows: int, span: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Point the state at rows that exist (a program writes `rows` cache rows from the state's length
        and drafter entries: stale or run-ahead lengths could reach past the caches, or past a verify's span;
        a prefill's logits row is one of its rows) and keep copies of everything the warm-up run may write:
        the state and tree buffers, those cache rows."""
        dec = self.dec
        saved = [(buf, buf.clone()) for buf in (*self._written, self.last)]
        self.last.zero_()
        length, entries = self.state[:2].tolist()  # NOTE: a host sync; recording synchronises anyway
        length = max(0, min(length, (span or dec.max_len) - rows))
        saved += [(c[:, length : length + rows], c[:, length : length + rows].clone()) for c in (dec.cache.ckv, dec.cache.kpe)]
        if dec.dcache is not None:
            rows = min(rows, dec.dcache.capacity)
            entries = max(0, min(entries, dec.dcache.capacity - rows))
            saved += [(c[:, entries : entries + rows], c[:, entries : entries + rows].clone())
                      for c in (dec.dcache.k, dec.dcache.v)]
        self.state[:2].copy_(torch.tensor([length, entries]))
        return saved

    @staticmethod
    def _restore(saved: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        for buf, copy in saved:
            buf.copy_(copy)

    # -- per round -------------------------------------------------------------------------------------
    def begin(self, length: int, draft_entries: int, root: int) -> None:
        """The host's state for this round (NOTE: the previous round's sync guarantees the pinned
        buffer's last copy has finished)."""
        self._host[0], self._host[1], self._host[2] = length, draft_entries, root
        self.state.copy_(self._host, non_blocking=True)

    def use(self, **values: float) -> None:
        """The reply's settings (penalty, temperature, top_p, seed) the recorded verifies read from the device,
        each written when it changes: a fill is a launch, never a host sync."""
        for name, v in values.items():
            if v != self._values[name]:
                getattr(self, name).fill_(v)
                self._values[name] = v

    def clock(self) -> _Clock:
        return _Clock(self.dec.device)

    def fetch(self, key: RoundShape, n: int, packed: torch.Tensor, clock: _Clock) -> Flight:
        """Start the round's one device-to-host copy (into one of two pinned buffers per size, so a round
        launched ahead does not overwrite the one being read) and close its clock."""
        clock.mark()
        if self.dec.device.type != "cuda":
            return Flight(key, n, packed.clone(), None, clock)
        bufs = self._pinned.setdefault(n, [torch.empty(packed.numel(), dtype=packed.dtype, pin_memory=True)
                                           for _ in range(2)])
        bufs.reverse()
        bufs[0].copy_(packed, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return Flight(key, n, bufs[0], event, clock)

    def run(self, key: tuple):
        """Replay the key's graph, or run its program directly (launched from Python: the library's
        products, registry.prefer_library)."""
        key = graph_key(key)
        if key in self.graphs:
            graph, out = self.graphs[key]
            graph.replay()
            return out
        with prefer_library():
            self.outputs[key] = out = self._program(key)()
        return out

    @torch.no_grad()
    def verify_seconds(self, n: int, tokens: torch.Tensor, repeats: int = 3, features: bool = True) -> float:
        """Time of one verify over n nodes (the replayed graph when capturing): the auto budget's cost
        curve. tokens [n]: varied, so the MoE touches as many experts as a real tree. features=False: an
        `ar` round's verify (n = 1). NOTE: writes only scratch (tree buffers past the root, cache rows past
        the committed length)."""
        dec = self.dec
        self.begin(*dec.committed_state(int(tokens[0])))
        self.tokens[:n].copy_(tokens[:n])  # NOTE: the root too (a drafting verify reads the draft's)
        self.parents[1:n], self.depth[1:n] = 0, 1  # a star: every node a child of the root
        key = VerifyKey("verify", n, features, span=self.target_span(dec.cache.length + n))  # as a round replays it
        self.prepare([key])
        best = float("inf")
        for _ in range(repeats):
            if self.capture:
                torch.cuda.synchronize(dec.device)
            t0 = time.perf_counter()
            self.run(key)
            if self.capture:
                torch.cuda.synchronize(dec.device)
            best = min(best, time.perf_counter() - t0)
        return best

    def tree(self, n: int) -> DraftTree:
        depth = min(n - 1, self.block - 1)
        return DraftTree(self.tokens[:n], self.parents[:n], self.depth[:n], self.logprobs[:n], max_depth=depth)

    def begin_chunk(self, meta: torch.Tensor, tokens: torch.Tensor) -> None:
        """A prefill chunk's state from the device: meta [4] (committed length, drafter entries, 0, the row
        whose logits count), tokens [r] (its prompt tokens). NOTE: chunks follow each other without a sync,
        so not through begin()'s one pinned buffer."""
        self.state.copy_(meta[:3])
        self.last.copy_(meta[3:])
        self.prompt[: tokens.shape[0]].copy_(tokens)

    # -- the programs (static shapes, no host synchronisation) ---------------------------------------
    def prefill(self, n: int, drafting: bool) -> torch.Tensor:
        """A prompt chunk: prompt[:n] at positions length.. under a causal mask, its KV rows written in place
        (and, drafting, the drafter's context rows at entries..). Rows past the chunk's tokens come after
        every real one, so no real row sees them; what they write lies past the counts the host keeps.
        Returns the logits [1, V] of row `last` only (a long prompt's every row would be [T, V] floats), in
        prompt_logits (outside the graphs' pool: the host reads them after other programs ran)."""
        dec = self.dec
        mask = self._causal.get(n)
        if mask is None:  # NOTE: made in the recording's warm-up run, outside the capture
            mask = causal_mask(n, dec.device)
            if self.recordable(("prefill", n, drafting)):
                self._causal[n] = mask
        length = self.state[0:1]
        pos = length + self.arange[:n]
        logits, feats = dec.forward(self.prompt[:n], pos, mask, SlotView(dec.cache, length, pos), drafting,
                                    rows=self.last)
        if drafting:
            k, v = dec.drafter.context_kv_stacked(feats.to(dec.draft_dtype), pos)
            dec.dcache.write_slots(k, v, self.state[1] + self.arange[:n])
        if self.prompt_logits is None:
            self.prompt_logits = torch.empty_like(logits)
        return self.prompt_logits.copy_(logits)

    def draft(self, mode: Mode, budget: int, span: int, choosing: bool) -> None:
        dec, b = self.dec, self.block
        length, root = self.state[0], self.state[2:3]
        ctx = [(dec.dcache.k[i, :span], dec.dcache.v[i, :span]) for i in range(dec.dcache.k.shape[0])]
        # NOTE: the context's visible entries are the first state[1] of the span (a device count, no mask)
        logits = dec.block_logits(self._state_block[2:], length + self.arange[:b], ctx, self.state[1:2])
        n = self.plan(mode, budget, False)[0]
        bufs = (self.tokens[:n], self.parents[:n], self.depth[:n], self.logprobs[:n])
        tree = dec.tree_from_logits(root, logits, mode, budget, bufs)
        n = tree.size
        for buf, t in zip(bufs, (tree.tokens, tree.parents, tree.depth, tree.logprobs)):
            if t.data_ptr() != buf.data_ptr():  # the reference built it elsewhere
                buf[:n].copy_(t)
        if choosing:
            self.cum_mass[:n].copy_(path_scores(tree).exp().cumsum(0))

    def verify(self, n: int, features: bool = True, variant: Variant = Variant(), span: int = 0):
        """variant.penalty: each node's logits penalised from its own sequence, the committed tokens read from the
        device (engine/repeat.py), so a round launched ahead needs nothing from the host. variant.sampled: each
        node's choice drawn (engine/sampling.py), keyed by the position its token goes to: length + depth + 1.
        The choices land in self.choice; returns the target features (None without `features`). NOTE: not the
        logits: a recorded program's outputs stay allocated, and [n, V] per recorded size and variant adds up."""
        dec = self.dec
        length = self.state[0:1]
        if n == 1:  # NOTE: a drafting round's draft wrote the root with its tree; a single node is drafted by none
            self.tokens[:1].copy_(self.state[2:3])
        tree = self.tree(n)
        view = SlotView(dec.cache, length, length + self.arange[:n], span)
        logits, feats = dec.forward(tree.tokens, length + tree.depth, tree.mask(), view, features)
        if variant.penalty:
            history, skip = dec.recent.history(length)
            logits = repeat_penalize(logits, history, tree, self.penalty, REPEAT_WINDOW, skip)
        if variant.sampled:
            top_p = self.top_p if variant.sampled == "top_p" else None
            self.choice[:n].copy_(sample(logits, self.temperature, top_p, self.seed, length + tree.depth + 1))
        else:
            torch.argmax(logits, -1, out=self.choice[:n])
        return feats

    def accept(self, n: int, feats: torch.Tensor | None, chain: bool = False, keep: bool = False,
               penalty: bool = False) -> torch.Tensor:
        """feats None: the drafter's context is not extended (and its device count not advanced). chain:
        node i is at depth i (ar, dflash), so the accepted path's rows are in place already (the moves
        would only write scratch rows past it). keep (a plain step, n = 1): the root's features go to the
        decoder's ring of kept features (Decoder.kept) instead of the drafter's context. penalty: the accepted
        tokens go to the repeat penalty's window (Decoder.recent)."""
        dec = self.dec
        tree = self.tree(n)
        choice = self.choice[:n]
        if keep:  # NOTE: the root's position is the committed length before the walk moves it
            dec.kept.index_copy_(0, self.state[0:1] % dec.kept.shape[0], feats[:1].to(dec.kept.dtype))
            feats = None
        drafting = dec.drafter is not None and feats is not None
        # NOTE: state moves on to the next round's here (in case that is launched before the host has read
        # this one); what follows reads the slots computed from the old state
        ok, bonus, path, slots = walk_commit(tree, choice, self.state, drafting)
        if not chain:  # NOTE: from depth 1 (the root is in place): path[k] >= k rises, so no row is read after it is written
            dec.cache.move_slots(slots[0, 1:], slots[1, 1:])
        if drafting:
            k, v = dec.drafter.context_kv_stacked(feats[path].to(dec.draft_dtype), slots[1])
            dec.dcache.write_slots(k, v, slots[2])
        if penalty:  # NOTE: slots[1, 0] is the committed length before the walk moved it
            dec.recent.commit(slots[1, 0:1], tree, ok != 0)
        return pack_round(tree, choice, ok, bonus)
