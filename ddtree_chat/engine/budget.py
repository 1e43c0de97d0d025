"""`--budget auto`: pick the tree size that maximises expected tokens per second.

Cost side: the target's verify time per tree size, measured once on this machine (cached per checkpoint
and device) and scaled by one running ratio of real rounds' target time to it, plus the drafter's time per
round and drafted size. Gain side: the expected accepted length of the top-b
prefixes under the drafter's product-of-marginals surrogate (sum of the nodes' path probabilities),
rescaled by a running calibration against what the target actually accepted."""

from __future__ import annotations

import json
import logging
import math

import torch

from .ddtree import Decoder
from .generation import AUTO_BUDGETS
from .parallel import TPGroup
from .tree import DraftTree, path_scores

EXPLORE = 8  # every EXPLORE-th round drafts past the last choice, to find out whether a larger tree pays ...
EXPLORE_MAX = 64  # ... and each exploration that confirms the choice doubles that interval, up to this
log = logging.getLogger(__name__)


class AutoBudget:
    def __init__(self, decoder: Decoder, tp: TPGroup, key: str):
        self.dec, self.tp, self.key = decoder, tp, key
        self.costs: dict[int, float] | None = None  # verify seconds per tree size, as measured (the curve's shape)
        self.cost_scale = 1.0  # real round target seconds / measured, EMA over the sizes verified (one for all)
        self.draft_s = 0.0  # drafter seconds per round (EMA over all drafted sizes)
        self.draft_costs: dict[int, float] = {}  # the same per drafted size
        self.calib = 1.0  # observed accepted drafted tokens / predicted (EMA)
        self.last = 0  # the budget chosen at the last exploring round: what the other rounds draft
        self.drafted = 0  # the size drafted this round (what next_budget returned)
        self.rounds = 0
        self.interval = EXPLORE  # rounds between explorations (exploring rounds choose and cannot run ahead)
        self.predicted = 0.0  # expected accepted drafted tokens of the last choice (before calibration)

    def next_budget(self) -> int:
        """Once per round: the tree size to draft (a collective under TP, and it resets the round's
        prediction). The size: the last choice, except every `interval`-th round (and the first),
        which drafts above it by one candidate or further while the measured verify cost stays within 25%
        of that next size's (a flat cost curve, as on a GPU, reaches the large trees at once; one that
        climbs, as on a CPU, steps). NOTE: drafting large every round would cost more than it finds."""
        self.drafted = self.tp.broadcast(self._next_size())  # NOTE: costs are timed per rank; rank 0 decides
        self.predicted = 0.0  # set again by choose(); a round that does not choose calibrates nothing
        return self.drafted

    @property
    def exploring(self) -> bool:
        """Whether this round drafts past the last choice (then choose() must cut it). Other rounds may
        verify the last choice whole: a fixed-size round, which the graph path runs one ahead."""
        return not self.last or self.rounds % self.interval == 0

    def following(self) -> int | None:
        """During a round (after its choice): the size the next round will verify whole, or None when
        the next round explores (so the graph path launches nothing ahead for it)."""
        return None if not self.last or (self.rounds + 1) % self.interval == 0 else self.last

    def _next_size(self) -> int:
        if not self.exploring:
            return self.last
        sizes = sorted(self.costs) if self.costs else list(AUTO_BUDGETS)
        above = [b for b in sizes if b > self.last]
        if not above:
            return sizes[-1]
        if not self.costs:
            return above[0]
        near = [b for b in above if self.costs[b] <= 1.25 * self.costs[above[0]]]
        return near[-1]

    # -- verify cost curve -----------------------------------------------------------------------
    def _cache_file(self):
        from ..paths import cache_dir

        d = cache_dir() / "budget"
        d.mkdir(parents=True, exist_ok=True)
        return d / f"{self.key}.json"

    @torch.no_grad()
    def _measure(self) -> dict[int, float]:
        dec = self.dec
        room = dec.max_len - dec.cache.length
        costs = {}
        for b in AUTO_BUDGETS:
            if b + 1 > room:
                break
            # NOTE: varied tokens, so the MoE routes them to as many distinct experts as a real tree does
            toks = torch.randint(0, dec.tcfg.vocab_size, (b + 1,), generator=torch.Generator().manual_seed(b))
            costs[b] = dec.graphs.verify_seconds(b + 1, toks.to(dec.device))  # what the rounds will run
        return costs

    def ensure_costs(self) -> None:
        """Every rank runs the same forwards; rank 0's numbers are the ones used."""
        if self.costs is not None:
            return
        cached = None
        if self.tp.rank == 0:
            try:
                cached = {int(k): float(v) for k, v in json.loads(self._cache_file().read_text()).items()}
            except (OSError, ValueError):
                cached = None
        cached = self.tp.broadcast(cached)
        costs = cached if cached is not None else self._measure()
        self.costs = self.tp.broadcast(costs)
        if cached is None and self.tp.rank == 0:
            log.info("verify cost per tree size (s): %s", self.costs)
            try:
                self._cache_file().write_text(json.dumps(self.costs))
            except OSError:
                pass

    # -- per round -------------------------------------------------------------------------------
    def choose(self, tree: DraftTree, cum_mass: torch.Tensor | None = None) -> int:
        """Budget for this round's tree (built at next_budget()). cum_mass: [N] cumulative path probability
        in node order, if the drafting program computed it already (graphs.py)."""
        drafted = tree.size - 1
        sizes = [b for b in sorted(self.costs) if b <= drafted]
        if cum_mass is None:
            cum_mass = path_scores(tree).exp().cumsum(0)
        # NOTE: best-first order: the first b nodes are the top-b tree, so its gain is a prefix sum.
        cum = cum_mass.tolist()  # the choice needs the host: one small copy
        best, best_rate, self.predicted = 0, 0.0, 0.0
        for b in sizes:
            m = cum[b] - 1.0
            rate = (1.0 + self.calib * m) / (self.cost_scale * self.costs[b] + self.draft_costs.get(b, self.draft_s))
            if rate > best_rate:
                best, best_rate, self.predicted = b, rate, m
        best = self.tp.broadcast(best or min(self.costs))
        # NOTE: only an exploring round moves the size later rounds draft; the others (rounds that do not run
        # ahead choose every round) cut their own tree. A cut that moved it stuck every round until the next exploration
        # (up to EXPLORE_MAX later) at the size one uncertain tree wanted: CPU auto ran 9% below budget 8.
        if self.exploring:  # a stable choice needs ever fewer checks; a change goes back to EXPLORE
            self.interval = min(2 * self.interval, EXPLORE_MAX) if best == self.last else EXPLORE
            self.last = best
        return best

    def observe(self, tree: DraftTree, accepted: int, draft_s: float, target_s: float) -> None:
        """Learn from a finished round: calibration of the gain (against what choose() predicted for the
        size it picked), and the real costs. The engine's first round teaches no costs: its times hold
        one-off work (the size it drafted kept a 2x drafting cost, never drafted again to correct it)."""
        predicted = self.predicted
        self.rounds += 1
        if self.rounds > 1:
            self._observe_costs(tree.size - 1, draft_s, target_s)
        if predicted > 1e-6:
            ratio = min((accepted - 1) / predicted, 4.0)
            self.calib = 0.9 * self.calib + 0.1 * ratio
        if not math.isfinite(self.calib):
            self.calib = 1.0

    def _observe_costs(self, verified: int, draft_s: float, target_s: float) -> None:
        self.draft_s = draft_s if self.draft_s == 0 else 0.9 * self.draft_s + 0.1 * draft_s
        if self.drafted:  # NOTE: a size's first sample joins the running mean
            self.draft_costs[self.drafted] = 0.8 * self.draft_costs.get(self.drafted, self.draft_s) + 0.2 * draft_s
        # NOTE: one scale for every size, not a cost per size: a size in use took on its real rounds' cost (the
        # accept work, a loaded CPU) while the others kept the bare measured forward, so unused sizes looked
        # cheap and CPU auto kept verifying 16-64 nodes where 8 was faster
        if verified in self.costs and self.costs[verified] > 0:
            self.cost_scale = 0.8 * self.cost_scale + 0.2 * target_s / self.costs[verified]
