"""One reply: the prompt, then rounds until a stop, as typed events. Owns the reply's policy: the budget
(fixed or --budget auto), the context's last slots (plain steps), the statistics and the streamed text.
Every tensor-parallel rank runs the same loop; rank 0 decides when to halt."""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterator

import torch

from ..modes import REPEAT_WINDOW, Mode
from .budget import PLAIN, AutoBudget
from .ddtree import Decoder
from .events import DoneEvent, RoundEvent, empty_tree
from .generation import GenerationConfig, Stats
from .graphs import Variant
from .parallel import TPGroup
from .repeat import repeat_penalize
from .sampling import kind, target_choice
from .tree import root_only


class ReplyLoop:
    def __init__(self, decoder: Decoder, tokenizer, tp: TPGroup, device: torch.device, cost_key: Callable[[], str]):
        """cost_key(): the cache key of this machine's verify cost curve (--budget auto), asked on first use."""
        self.dec, self.tokenizer, self.tp, self.device = decoder, tokenizer, tp, device
        self._cost_key = cost_key
        self.auto: AutoBudget | None = None  # made by the first auto reply; it keeps learning across replies

    def _penalized(self, logits: torch.Tensor, ids: list[int], penalty: float) -> torch.Tensor:
        """The prompt's next-token logits [1, V] under the repeat penalty: its last token as the root of a one-node
        tree, the ones before as history (the rounds' rule, Decoder.round)."""
        if penalty == 1:
            return logits
        history = torch.tensor(ids[-REPEAT_WINDOW:-1], dtype=torch.long, device=logits.device)
        return repeat_penalize(logits, history, root_only(ids[-1], logits.device), penalty, REPEAT_WINDOW)

    def run(self, ids: list[int], cfg: GenerationConfig, stop: threading.Event | None) -> Iterator[RoundEvent | DoneEvent]:
        """Yield the prefill's RoundEvent, one per round, then a DoneEvent. A consumer that closes the
        generator ends the reply quietly after the current round (in step with the workers)."""
        dec = self.dec
        mode = cfg.mode if dec.drafter is not None else Mode.AR
        auto = mode is Mode.DDTREE and cfg.budget == "auto"
        budget = dec.shape(mode, cfg.budget).budget  # "auto" stays "auto" until the first round picks a size
        stop_ids = frozenset(cfg.stop_token_ids if cfg.stop_token_ids is not None else self.tokenizer.stop_ids)
        stats = Stats()
        detok = self.tokenizer.stream_decoder()
        out: list[int] = []
        t_start = time.perf_counter()
        variant = Variant(cfg.repeat_penalty != 1, kind(cfg.temperature, cfg.top_p))
        t_record = dec.record_variant(variant)  # one-time, as the next line's
        logits = dec.prefill(ids, drafting=mode is not Mode.AR)
        t_costs = t_record + (self._ensure_auto() if auto else 0.0)  # a one-time measurement is not the prompt's time
        if auto:
            self.auto.start_reply(cfg.temperature)
        first = int(target_choice(self._penalized(logits[None], ids, cfg.repeat_penalty), cfg.temperature, cfg.top_p,
                                  torch.tensor(cfg.seed, device=self.device),
                                  torch.tensor([len(ids)], device=self.device))[0])  # NOTE: its position
        prompt_s = time.perf_counter() - t_start - t_costs  # NOTE: after int(): the device finished the prefill
        dec.pending = first
        out.append(first)
        stats.target_forwards += 1
        stats.generated += 1
        reason = "stop_token" if first in stop_ids else ("max_new_tokens" if cfg.max_new_tokens <= 1 else None)
        closing = False  # the consumer closed the generator: finish quietly, in step with the workers
        try:
            yield RoundEvent([first], _text(detok, [first], stop_ids), empty_tree(), cfg.budget if auto else budget,
                             mode, time.perf_counter() - t_start, prefill=True)
        except GeneratorExit:
            closing = True
        while reason is None:
            if self._halt(closing or (stop is not None and stop.is_set())):
                reason = "stopped"
                break
            choose = then = None
            round_mode = mode
            if auto:
                budget, choose, then = self._auto_round()
                round_mode = Mode.AR if budget == PLAIN else mode  # NOTE: the auto budget chose plain steps
            room = dec.max_len - dec.cache.length
            if room < 1:
                reason = "context"
                break
            learns = auto
            round_budget = budget
            if dec.shape(round_mode, budget).nodes > room:
                # NOTE: the context's last slots hold no tree or block: plain steps fill them (recorded at load,
                # unlike a tree cut to each remaining room)
                round_mode, round_budget, choose, then, learns = Mode.AR, 0, None, None, False
            t0 = time.perf_counter()
            r = dec.round(round_mode, round_budget, cfg.temperature, cfg.top_p, cfg.seed, stop_ids,
                          cfg.max_new_tokens - len(out), choose, then, keep=auto, repeat_penalty=cfg.repeat_penalty)
            if learns:
                # NOTE: rounds run ahead overlap the host's work, so device seconds are their cost (by wall time an
                # exploring tree, which waits for its choice with nothing ahead of it, would count that wait)
                wall = None if dec.runs_ahead() else time.perf_counter() - t0
                self.auto.observe(r.tree, len(r.emitted), r.t_draft, r.t_target, r.caught_up, r.t_catch_up, wall,
                                  r.recorded)
            out.extend(r.emitted)
            stats.target_forwards += 1
            stats.generated += len(r.emitted)
            stats.add_round(len(r.emitted))
            stats.time_draft += r.t_draft + r.t_catch_up  # NOTE: the catch-up is drafting's cost
            stats.time_target += r.t_target
            if r.emitted[-1] in stop_ids:
                reason = "stop_token"
            elif len(out) >= cfg.max_new_tokens:
                reason = "max_new_tokens"
            if closing:
                continue
            ev = RoundEvent(r.emitted, _text(detok, r.emitted, stop_ids), dict(r.host_tree, accepted_nodes=r.path),
                            r.tree.size - 1 if round_mode is Mode.DDTREE else round_budget, round_mode,
                            time.perf_counter() - t0, auto_budget=auto, draft_s=r.t_draft + r.t_catch_up,
                            target_s=r.t_target)
            try:
                yield ev
            except GeneratorExit:
                closing = True
        if closing:
            return
        elapsed = time.perf_counter() - t_start
        yield DoneEvent(out, self.tokenizer.decode([t for t in out if t not in stop_ids]), detok.flush(), stats.rounds,
                        stats.target_forwards, stats.mean_accepted_length,
                        len(out) / elapsed if elapsed > 0 else 0.0, reason,
                        {str(k): v for k, v in sorted(stats.histogram.items())}, mode,
                        cfg.budget if auto else budget, elapsed, stats.time_draft, stats.time_target, len(ids), prompt_s)

    def _halt(self, wanted: bool) -> bool:
        """Whether to stop before the next round: rank 0's wish on every rank (all must run the same rounds)."""
        return self.tp.broadcast(wanted) if self.tp.world > 1 else wanted

    def _ensure_auto(self) -> float:
        """Make the auto budget and its verify cost curve (measured once per machine); the seconds spent."""
        if self.auto is None:
            self.auto = AutoBudget(self.dec, self.tp, self._cost_key())
        t0 = time.perf_counter()
        self.auto.ensure_costs()
        return time.perf_counter() - t0

    def _auto_round(self):
        """(budget, choose, then) of an auto round (budget PLAIN: a plain `ar` round). NOTE: between exploring
        rounds the graph path verifies the last choice whole, so the round is a fixed-size one and runs
        ahead; rounds run directly still cut it (a climbing CPU cost)."""
        auto = self.auto
        budget = auto.next_budget()  # NOTE: every round: the search moves it
        choose = auto.choose if budget != PLAIN and (auto.exploring or not self.dec.runs_ahead()) else None
        return budget, choose, auto.following


def _text(detok, ids: list[int], stop_ids: frozenset[int]) -> str:
    """Streamed text of the new ids; a stop token ends the reply and is not shown."""
    return "".join(detok.push(t) for t in ids if t not in stop_ids)
