"""The decoding round: draft -> tree -> verify -> accept -> commit, plus prefill. The Decoder keeps the
host's state (committed tokens, pending root, counts) and runs the round's programs (graphs.StaticRound),
which an executor runs directly or replays as recorded CUDA graphs.

State between calls: the target cache holds the committed tokens; `pending` is the last emitted token
(the next round's root), not yet in the cache. The drafter context holds the committed tokens' features,
except those `ar` rounds committed since the last drafting round (the next one recomputes them first).
NOTE: every round is committed before its event is yielded, so stopping between rounds leaves the
engine exactly at the emitted tokens."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from . import ops, sampling
from .config import DraftConfig, TargetConfig
from .errors import ContextLengthError
from ..modes import MAX_BUDGET, REPEAT_WINDOW, Mode
from .generation import RoundShape
from .kv_cache import DraftCache, KVCache
from .graphs import PREFILL_SIZES, PrefillKey, StaticRound, Variant
from .model import KimiModel
from .repeat import RecentTokens
from .tree import DraftTree, build_tree

MAX_TREE_POSITIONS = MAX_BUDGET + 1  # positions a round may use past max_len's committed context (a tree, a block)
KEPT_ROWS = 512  # the auto budget's plain steps' target features kept for the drafter's catch-up (a ring)

log = logging.getLogger(__name__)


@dataclass
class RoundResult:
    tree: DraftTree  # on the device (the auto budget learns from it)
    host_tree: dict  # the same tree as host lists: tokens, parents, depth, draft_logprobs, target_tokens
    path: list[int]  # accepted nodes, root first
    emitted: list[int]  # accepted tokens after the root, plus the bonus (truncated at a stop)
    t_draft: float
    t_target: float
    caught_up: int = 0  # committed tokens whose drafter context rows the round recomputed first
    t_catch_up: float = 0.0  # their seconds (not in t_draft)
    recorded: bool = False  # it recorded programs (a shape's first use): its wall time holds the recording


class Decoder:
    def __init__(self, target: KimiModel, tcfg: TargetConfig, drafter=None, dcfg: DraftConfig | None = None,
                 max_len: int = 4096):
        self.target, self.tcfg, self.drafter, self.dcfg = target, tcfg, drafter, dcfg
        p = next(target.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.cache = KVCache(tcfg.num_layers, max_len, tcfg.kv_lora_rank, tcfg.qk_rope_head_dim, self.dtype, self.device)
        self.feature_layers = tuple(dcfg.target_layer_ids) if dcfg else ()  # the target layers the drafter reads
        # NOTE: the drafter may run in a lower precision than the target (only speed depends on it); it then
        # needs its own copies of the target's embedding and lm head in that dtype.
        self.draft_dtype = next(drafter.parameters()).dtype if drafter is not None else self.dtype
        self.draft_embed = self.draft_head = None
        if drafter is not None and self.draft_dtype != self.dtype:
            self.draft_embed = target.embed_tokens.weight.to(self.draft_dtype)
            self.draft_head = target.lm_head.weight.to(self.draft_dtype)
        self.dcache = DraftCache(dcfg.num_layers, max_len, drafter.kv_heads, dcfg.head_dim, self.draft_dtype,
                                 self.device, dcfg.kv_window) if dcfg else None
        # [KEPT_ROWS, len(layers) * H]: a plain step's features at row position % KEPT_ROWS (graphs.accept); kept_from:
        # the first position of the run of them held since the drafter's context ended (None: none held)
        self.kept = torch.zeros(KEPT_ROWS, len(self.feature_layers) * tcfg.hidden_size, dtype=self.dtype,
                                device=self.device) if dcfg else None
        self.kept_from: int | None = None
        # NOTE: positions stay below max_len + one tree (the context refuses rounds past max_len); the
        # tables are built now, outside any CUDA-graph capture. Products that read one input become one.
        for model, dtype in ((target, self.dtype), (drafter, self.draft_dtype)):
            if model is not None:
                model.fuse_projections()
                model.reserve_rope(max_len + MAX_TREE_POSITIONS, dtype)
        self.tokens: list[int] = []  # committed (in the cache)
        self.recent = RecentTokens(REPEAT_WINDOW, self.device)  # their last ones on the device (repeat penalty)
        self.pending: int | None = None
        self.graphs = StaticRound(self, capture=False)  # the round's programs (the engine may record them)
        self._ahead = None  # a graphs.Flight launched before the previous round's result was read
        # None: rounds run one ahead when recorded (a direct run gains nothing by it); True/False force it
        # (off for drafters that read host state, such as the tests' oracle drafters)
        self.run_ahead: bool | None = None

    @property
    def max_len(self) -> int:
        return self.cache.max_len

    def shape(self, mode: Mode, budget: int) -> RoundShape:
        """The round a mode and budget make with this drafter (without one, every round is ar)."""
        return RoundShape.of(mode, budget, self.dcfg.block_size if self.drafter is not None else 0)

    @property
    def block(self) -> int:
        """The drafter's block size (query slots per round; 1 without a drafter)."""
        return self.dcfg.block_size if self.dcfg else 1

    # -- target forward over new tokens on top of the committed cache ------------------------------
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache=None,
                features: bool = True, rows: torch.Tensor | None = None):
        """Target forward over new tokens written after the committed cache (nothing is committed).
        cache: what attention reads and writes (default the KV cache itself; graphs pass a slot view).
        features=False: no drafter features (None), for a forward whose context the drafter never gets.
        rows: device indices of the only rows whose logits are wanted (a prompt's last: its every row's
        [T, V] floats could fill the GPU)."""
        hidden, feats = self.target(tokens.to(self.device), positions.to(self.device), mask.to(self.device),
                                    self.cache if cache is None else cache, self.feature_layers if features else ())
        return self.target.logits(hidden if rows is None else hidden.index_select(-2, rows)), feats

    def committed_state(self, root: int) -> tuple[int, int, int]:
        """(committed length, drafter entries, root token): what a round's programs read from the device."""
        return self.cache.length, self.dcache.length if self.dcache is not None else 0, root

    def prefill(self, ids: list[int], drafting: bool = True) -> torch.Tensor:
        """Bring the state to `ids` (reusing the longest common committed prefix); returns the logits
        [V] for the token after ids[-1]. Afterwards all of ids are committed and nothing is pending.
        drafting=False (an `ar` reply) leaves the drafter's context behind; a drafting prefill first
        recomputes the positions it lacks (they were committed by `ar` replies)."""
        if not ids:
            raise ValueError("the prompt is empty")
        lcp = 0
        for a, b in zip(self.tokens, ids):
            if a != b:
                break
            lcp += 1
        if drafting and self.dcache is not None:
            self._catch_up_kept()  # NOTE: the drafter's context may lack what the last reply's plain steps kept
            lcp = min(lcp, self.dcache.end_pos)
        lcp = min(lcp, len(ids) - 1)  # at least one token must run to produce logits
        if len(ids) + 1 > self.max_len:
            raise ContextLengthError(
                f"the prompt has {len(ids)} tokens but the context holds {self.max_len}; shorten it or start a new chat.")
        self.cache.truncate(lcp)
        del self.tokens[lcp:]
        if self.dcache is not None:
            self.dcache.truncate_to_pos(lcp)
        self.kept_from = None
        self.pending = None
        self._ahead = None  # NOTE: a round launched past the last reply's end is never read
        new = ids[lcp:]
        drafting = drafting and self.dcache is not None
        return self._prefill_chunks(new, self._chunks(len(new), drafting), drafting)

    def _chunks(self, t: int, drafting: bool) -> list[tuple[int, int]]:
        """(program rows, prompt tokens) per prefill chunk. Recorded chunks are padded to the recorded sizes
        (largest first) while they fit the context; otherwise (near its end, or not recording) each chunk
        runs exactly its tokens, at most the largest recorded size at a time."""
        sr, room = self.graphs, self.max_len - self.cache.length
        sizes = sr.prefill_sizes(drafting)
        if sr.pads_prefill and sizes:
            chunks, left = [], t
            while 0 < left and chunks is not None:
                n = next((s for s in sizes if s >= left), sizes[-1])
                chunks = chunks + [(n, min(n, left))] if n <= room else None
                left, room = left - min(n, left), room - min(n, left)
            if chunks is not None:
                return chunks
        step = min(PREFILL_SIZES[-1], self.dcache.capacity if drafting else self.max_len)
        return [(min(step, t - i), min(step, t - i)) for i in range(0, t, step)]

    def _prefill_chunks(self, new: list[int], chunks: list[tuple[int, int]], drafting: bool) -> torch.Tensor:
        """The prompt through the prefill program (graphs.StaticRound.prefill), chunk by chunk; the logits
        [V] of its last token. NOTE: one upload (the tokens and every chunk's state, the drafter window's
        slides worked out ahead as make_room() will make them), then no host sync until the caller reads
        them. The device state is left at the last chunk's start: the next round's begin() writes the
        committed one."""
        sr = self.graphs
        meta, (start, entries, _) = [], self.committed_state(0)
        for n, r in chunks:
            if drafting:
                entries = min(entries, self.dcache.capacity - n)  # make_room(n)'s slide
            meta += [start, entries, 0, r - 1]
            start, entries = start + r, entries + (r if drafting else 0)
        staged = torch.tensor(new + meta, device=self.device)
        off = 0
        for i, (n, r) in enumerate(chunks):
            if drafting:
                self.dcache.make_room(n)  # NOTE: the chunk writes n rows, r of which count
            sr.begin_chunk(staged[len(new) + 4 * i : len(new) + 4 * i + 4], staged[off : off + r])
            key = PrefillKey("prefill", n, drafting)
            self._record([key])
            logits = sr.run(key)
            self.cache.advance(r)
            self.tokens.extend(new[off : off + r])
            if drafting:
                self.dcache.advance(r, self.cache.length)
            off += r
        return logits[0]

    def _record(self, keys) -> None:
        """Record these programs if the executor records; a program that cannot be recorded (an op that
        cannot be captured, no memory) turns recording off: it and every later one run directly."""
        if not self.graphs.capture:
            return
        try:
            self.graphs.prepare(keys)
        except (RuntimeError, torch.OutOfMemoryError) as e:
            log.warning("CUDA graphs off, rounds run eagerly: %s", str(e).splitlines()[0][:200])
            self.graphs.stop_recording()
            self._ahead = None

    def record_variant(self, variant: Variant) -> float:
        """Before a reply whose settings change its programs (a repeat penalty, sampling): record its rounds'
        programs in that variant; the seconds spent (0 once they are, or when rounds run directly)."""
        sr = self.graphs
        before = sr.capture_s
        if sr.capture and variant not in sr.variants:  # NOTE: once: not ~60 keys named again before each reply
            self._record(sr.variant_keys(variant))
            sr.variants.add(variant)
        return sr.capture_s - before

    # -- one speculative round --------------------------------------------------------------------
    def block_logits(self, block: torch.Tensor, pos: torch.Tensor, ctx, mask=None) -> torch.Tensor:
        """block [B] (root, then mask tokens) at positions [B] over the drafter context `ctx` (per layer
        (k, v)) -> the drafter's logits [B-1, V] for the slots after the root (log-probs serve as well)."""
        if self.draft_head is None:  # shared with the target (the normal case)
            return self.target.head(self.drafter(self.target.embed_tokens(block), pos, ctx, mask)[1:])
        hidden = self.drafter(F.embedding(block, self.draft_embed), pos, ctx, mask)
        if hidden.is_cpu:  # NOTE: its packed form (ops/cpu_packed.py); the GPU keeps its product as recorded
            return ops.cpu_packed.linear(hidden[1:], self.draft_head)
        return hidden[1:] @ self.draft_head.T

    @staticmethod
    def tree_from_logits(root, logits: torch.Tensor, mode: Mode, budget: int, out=None) -> DraftTree:
        """dflash: the argmax chain; ddtree: the top-`budget` prefixes (both without host syncs). out: buffers
        the tree kernel may build into (tree.build_tree)."""
        if mode == Mode.DFLASH:
            return build_tree(root, *ops.topk_logprobs(logits, 1), logits.shape[0], out)
        depth = min(logits.shape[0], budget)
        return build_tree(root, *ops.topk_logprobs(logits[:depth], min(budget, logits.shape[-1])), budget, out)

    @torch.no_grad()
    def round(self, mode: Mode, budget: int, temperature: float, top_p: float, seed: int,
              stop_ids: frozenset[int], room: int, choose: Callable[..., int] | None = None,
              then: Callable[[], int | None] | None = None, keep: bool = False,
              repeat_penalty: float = 1.0) -> RoundResult:
        """One round from the pending token. `room`: tokens still allowed (>= 1). `choose(tree, cum_mass)`
        may cut the drafted tree (built at `budget`) down to fewer nodes. `then()`: the budget the next
        round will verify whole (0: a plain `ar` round; None: it will not be a fixed-size round); default:
        this round's own, when it has no `choose`. Rounds followed by a fixed-size one run one ahead
        when recorded: the next round is launched (on the state this round's accept leaves on the device)
        before this one's result is read, so the GPU works while the host reads; a round launched past a
        stop or the limit is simply never read (it wrote scratch only). A drafting round after `ar` rounds
        first catches the drafter's context up (_catch_up). keep: this reply's `ar` rounds (the auto budget's
        plain steps) keep their target features, so that catch-up needs no target forward. repeat_penalty > 1:
        each node's logits penalised from its own sequence (engine/repeat.py). seed: the sampling seed at T > 0
        (>= 0; each draw keyed by its token's position, engine/sampling.py)."""
        sr = self.graphs
        capture_s = sr.capture_s  # recording seconds so far: a round that records adds to them
        if not sr.fits(mode, budget):  # NOTE: a drafter window narrower than its block: plain steps
            mode, budget, choose, then = Mode.AR, 0, None, None
        key = RoundShape(mode, budget)
        caught, catch_clock = 0, None
        if sr.drafting(mode) and self.dcache.end_pos < self.cache.length:
            catch_clock = sr.clock()
            caught = self._catch_up()
            catch_clock.mark()
        flight, self._ahead = self._ahead, None
        if flight is not None and (flight.key != key or choose is not None or not self.runs_ahead()):
            flight = None  # launched for another kind of round: never read
        if flight is None:
            flight = self._launch(mode, budget, temperature, top_p, seed, choose, fresh=True, keep=keep,
                                  repeat_penalty=repeat_penalty)
        # NOTE: asked after the launch: a choosing round has made its choice by now
        nxt = (budget if choose is None else None) if then is None else then()
        nxt_mode = Mode.AR if nxt == 0 else mode  # NOTE: after a drafting round, the auto budget's plain steps
        if (nxt is not None and self.runs_ahead() and sr.fits(nxt_mode, nxt)
                and self._room_ahead(flight.n, sr.plan(nxt_mode, nxt, False)[0])):
            # NOTE: at T > 0 its draws are keyed by the positions it reads on the device (engine/sampling.py)
            self._ahead = self._launch(nxt_mode, nxt, temperature, top_p, seed, None, fresh=False, keep=keep,
                                       repeat_penalty=repeat_penalty)
        n = flight.n
        host_tree, path, emitted = self._outcome(flight.wait(), n, stop_ids, room)  # NOTE: the round's one sync
        t_draft, t_target = flight.clock.split()
        m = len(emitted)
        start = self.cache.length
        # NOTE: accept() moved the path's rows to start..; only the first m count
        self.cache.advance(m)
        self.tokens.extend([self.pending] + emitted[:-1])
        if self.dcache is not None and mode != Mode.AR:
            self.dcache.advance(m, start + m)
        if mode != Mode.AR or not keep or self.dcache is None:
            self.kept_from = None
        elif self.kept_from is None:
            self.kept_from = start
        self.pending = emitted[-1]
        if m < len(path):  # cut at a stop or the limit: the device state ran ahead of the host's
            self._ahead = None
        t_catch_up = catch_clock.seconds() if catch_clock is not None else 0.0
        return RoundResult(sr.tree(n), host_tree, path, emitted, t_draft, t_target, caught, t_catch_up,
                           sr.capture_s != capture_s)

    def _catch_up(self) -> int:
        """Before a drafting round after `ar` rounds (`--budget auto`'s plain steps): the features those kept
        (_catch_up_kept), else recompute the committed positions the drafter's context lacks, as a drafting
        prefill does (the same chunks and programs; they write the target's rows again, which row-invariant
        kernels leave as they were). Returns how many."""
        self._ahead = None  # NOTE: launched on the state before the catch-up: never read
        kept = self._catch_up_kept()
        if kept:
            return kept
        start = self.dcache.end_pos
        missed = self.tokens[start:]
        self.cache.truncate(start)
        del self.tokens[start:]
        self._prefill_chunks(missed, self._chunks(len(missed), True), True)
        return len(missed)

    def _catch_up_kept(self) -> int:
        """The drafter's missing context rows from the features plain steps kept (no target forward), when
        they hold every missing position; returns how many (0: they do not)."""
        start, end = self.dcache.end_pos, self.cache.length
        # NOTE: fewer than the ring holds: a plain step launched ahead writes the row of position `end`
        if self.kept_from is None or self.kept_from > start or not 0 < end - start < KEPT_ROWS:
            return 0
        pos = torch.arange(start, end, device=self.device)
        k, v = self.drafter.context_kv_stacked(self.kept[pos % KEPT_ROWS].to(self.draft_dtype), pos)
        self.dcache.append(k, v, end)
        self.kept_from = None
        return end - start

    def runs_ahead(self) -> bool:
        """Whether fixed-size rounds run one ahead (recorded rounds; run_ahead overrides)."""
        return self.graphs.capture if self.run_ahead is None else self.run_ahead

    def _room_ahead(self, n: int, n_next: int) -> bool:
        """Whether a round of n_next nodes launched now, before this n-node round's path is known, surely
        fits both caches."""
        b = self.block
        fits = self.cache.length + min(n, b) + n_next <= self.max_len
        return fits and (self.dcache is None or self.dcache.length + 2 * b <= self.dcache.capacity)

    def _launch(self, mode, budget, temperature, top_p, seed, choose, fresh: bool, keep: bool = False,
                repeat_penalty: float = 1.0):
        """Enqueue one round's programs (fresh: from the host's state; else from the device state the
        previous round's accept left) and start the copy of its result."""
        sr, choosing = self.graphs, choose is not None
        n, sizes = sr.plan(mode, budget, choosing)
        b = self.block
        held = None
        # NOTE: launched ahead, the round starts after the one in flight commits its path (at most b tokens)
        upto = None if fresh else self.cache.length + b + n
        if self.dcache is not None:
            if fresh:  # NOTE: room for this round's and a following one's context rows
                self.dcache.make_room(2 * b if self.dcache.capacity >= 4 * b else b)
            else:
                held = self.dcache.length + b  # the entries this round may see, at most
        keep = keep and mode == Mode.AR and self.dcache is not None
        # NOTE: the penalty and the draw run inside the verify and accept programs, from values on the device
        variant = Variant(repeat_penalty != 1, sampling.kind(temperature, top_p))
        self._record(sr.round_keys(mode, budget, sizes, choosing, held, keep, variant, upto))
        sr.use(penalty=repeat_penalty)
        if variant.sampled:
            sr.use(temperature=temperature, top_p=top_p, seed=seed)
        if fresh:
            sr.begin(*self.committed_state(self.pending))
            if variant.penalty:
                self.recent.write(self.tokens)
        clock = sr.clock()
        if n > 1:
            sr.run(sr.draft_key(mode, budget, choosing, held))
        if choosing and n > 1:
            clock.mark()  # NOTE: the draft's end on the GPU: the choice's host wait counts in neither part
            n = choose(sr.tree(n), sr.cum_mass[:n]) + 1
        clock.mark()
        sr.run(sr.verify_key(mode, n, keep, variant, upto))
        packed = sr.run(sr.accept_key(mode, n, keep, variant, upto))
        return sr.fetch(RoundShape(mode, budget), n, packed, clock)

    @staticmethod
    def _outcome(packed: torch.Tensor, n: int, stop_ids: frozenset[int], room: int):
        """The round's one device-to-host copy (pack_round's layout) -> (host tree, accepted path, emitted
        tokens: the path's tokens after the root plus the bonus, cut at a stop token or the room left)."""
        host = packed.tolist()  # exact for ids < 2**53
        cols = [host[i * n : (i + 1) * n] for i in range(6)]
        toks, parents, depth, choices, accepted = ([int(v) for v in c] for c in (cols[0], cols[1], cols[2], cols[4], cols[5]))
        bonus = int(host[-1])
        host_tree = {"tokens": toks, "parents": parents, "depth": depth,
                     "draft_logprobs": [round(v, 4) for v in cols[3]], "target_tokens": choices}
        path = [i for i in range(n) if accepted[i]]  # node order is depth order along the path
        emitted = [toks[i] for i in path[1:]] + [bonus]
        for i, tok in enumerate(emitted):  # nothing after a stop token, nothing past the limit
            if tok in stop_ids or i + 1 >= room:
                emitted = emitted[: i + 1]
                break
        return host_tree, path, emitted
