"""`--budget auto`: pick the tree size that maximises expected tokens per second.

Cost side: the target's verify time per tree size, measured once on this machine (cached per checkpoint
and device) and scaled by one running ratio of real rounds' target time to it, plus the drafter's time per
round and drafted size. Gain side: the expected accepted length of the top-b
prefixes under the drafter's product-of-marginals surrogate (sum of the nodes' path probabilities),
rescaled by a running calibration against what the target actually accepted.

Plain steps: where no tree pays (drafting costs most of a target step and the target rarely agrees, as at
T > 0 on a CPU), an exploring round may choose to draft nothing: the rounds until the next exploration are
plain `ar` rounds (no features, no drafter context row), and the next drafting round first catches the
drafter's context up on the tokens they committed (Decoder.round). Their cost per token: a plain round's
seconds plus that catch-up's share."""

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
PLAIN_EXPLORE_MAX = 256  # the same for plain steps: their exploration also pays the drafter's catch-up
PLAIN = 0  # the choice that drafts nothing: plain `ar` rounds until the next exploring round
PLAIN_MARGIN = 1.05  # what the choice not in force must beat the other by (plain steps vs trees)
# what tree rounds gave decays by this per tree round (a memory of ~50 rounds: their mean's error ~8% where one
# round gives 1-5 tokens; at 0.9, ~10 rounds, a standard-error bound was needed against lucky stretches, and it
# held plain steps against trees 1.16-1.3x faster: benchmarks/auto_budget_sim.py)
TREE_DECAY = 0.98
# an exploring tree this much faster than plain steps brings the next exploration closer (at T = 0.7 a tree
# round gives 1-5 tokens: a 5% win is luck, and each pulled the explorations back to every 64 rounds)
SOONER = 1.5
log = logging.getLogger(__name__)


class AutoBudget:
    def __init__(self, decoder: Decoder, tp: TPGroup, key: str):
        self.dec, self.tp, self.key = decoder, tp, key
        self.costs: dict[int, float] | None = None  # verify seconds per tree size, as measured (the curve's shape)
        self.cost_scale = 1.0  # real round target seconds / measured, EMA over the sizes verified (one for all)
        self.draft_s = 0.0  # drafter seconds per round (EMA over all drafted sizes)
        self.draft_costs: dict[int, float] = {}  # the same per drafted size
        self.calib = 1.0  # observed accepted drafted tokens / predicted (EMA)
        self.last: int | None = None  # chosen at the last exploring round: what the other rounds draft (PLAIN: none)
        self.plain_cost: float | None = None  # measured seconds of a plain step's verify (None: not measured)
        self.plain_s = 0.0  # real plain round seconds (EMA; 0 until one ran)
        self.caught = [0.0, 0.0]  # the drafter's catch-ups after plain rounds: decaying sums of tokens, seconds
        self.trees = [0.0, 0.0]  # what tree rounds gave: decaying sums of tokens and seconds
        self.drafted: int | None = None  # the size drafted this round (what next_budget returned; PLAIN: none)
        self.rounds = 0
        self.interval = EXPLORE  # rounds between explorations (exploring rounds choose and cannot run ahead)
        self.predicted = 0.0  # expected accepted drafted tokens of the last choice (before calibration)
        self.temperature: float | None = None  # the last reply's

    def start_reply(self, temperature: float) -> None:
        """A reply at another temperature than the last one accepts differently: what tree rounds gave and
        the calibration start over, and its first round explores (plain steps chosen at T > 0 would
        otherwise hold a T = 0 reply for a few explorations, up to EXPLORE_MAX rounds each)."""
        if temperature != self.temperature:
            self.temperature = temperature
            self.trees, self.calib, self.last, self.interval = [0.0, 0.0], 1.0, None, EXPLORE

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
        return self.last is None or self.rounds % self.interval == 0

    def following(self) -> int | None:
        """During a round (after its choice): the size the next round will verify whole (PLAIN: a plain
        round), or None when the next round explores (so the graph path launches nothing ahead for it)."""
        return None if self.last is None or (self.rounds + 1) % self.interval == 0 else self.last

    def _next_size(self) -> int:
        if not self.exploring:
            return self.last
        sizes = sorted(self.costs) if self.costs else list(AUTO_BUDGETS)
        above = [b for b in sizes if b > (self.last or 0)]
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
        """Verify seconds per candidate size, and under PLAIN a plain step's (one node, no features)."""
        dec = self.dec
        room = dec.max_len - dec.cache.length
        root = torch.zeros(1, dtype=torch.long, device=dec.device)
        costs = {PLAIN: dec.graphs.verify_seconds(1, root, features=False)}  # what a plain round runs
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
        costs = self.tp.broadcast(costs)
        if cached is None and self.tp.rank == 0:
            log.info("verify cost per tree size (s; 0: a plain step): %s", costs)
            try:
                self._cache_file().write_text(json.dumps(costs))
            except OSError:
                pass
        self.plain_cost = costs.pop(PLAIN, None)
        self.costs = costs

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
        best = best or min(self.costs)
        # NOTE: only an exploring round moves the size later rounds draft; the others (rounds that do not run
        # ahead choose every round) cut their own tree. A cut that moved it stuck every round until the next exploration
        # (up to EXPLORE_MAX later) at the size one uncertain tree wanted: CPU auto ran 9% below budget 8.
        if not self.exploring:
            return self.tp.broadcast(best)
        # NOTE: this round's tree is drafted (paid for), so it is verified; plain steps are for the later rounds.
        # Against the rate tree rounds gave, not this tree's prediction: at T > 0 a confident tree is followed by
        # average ones (choosing by it, CPU auto at T=0.7 verified trees in 60% of its rounds: 0.80x of ar).
        trees = self.tree_rate or best_rate
        # NOTE: the margin goes to the choice in force: a tie between plain steps and trees flipped to trees for
        # a stretch after every lucky exploring tree (CPU auto at T=0.7 ran 0.92x of ar, with ~5% tree rounds)
        plain = PLAIN_MARGIN * self.plain_rate() > trees if self.last == PLAIN else self.plain_rate() > PLAIN_MARGIN * trees
        best, later = self.tp.broadcast((best, PLAIN if plain else best))
        # a stable choice needs ever fewer checks; a change goes back to EXPLORE
        cap = PLAIN_EXPLORE_MAX if later == PLAIN else EXPLORE_MAX
        self.interval = min(2 * self.interval, cap) if later == self.last else EXPLORE
        self.last = later
        return best

    def plain_rate(self) -> float:
        """Expected tokens per second of plain rounds: one token per round, whose drafter context the next
        drafting round recomputes (0 when a plain step's cost is not known)."""
        # NOTE: before one ran, the measured verify unscaled: cost_scale holds a tree round's accept work
        # (on a CPU it made a plain step look 1.5x its real cost, so auto drafted until the trees' rate fell)
        step = self.plain_s or self.plain_cost or 0.0
        return 1.0 / (step + self.catch_up_s) if step > 0 else 0.0

    @property
    def tree_rate(self) -> float:
        """Tokens per second that tree rounds gave (0 until one was learned from). NOTE: a ratio of sums: a
        round that happened to accept many tokens moves it by its share of the time, not as one rate of several."""
        return self.trees[0] / self.trees[1] if self.trees[1] > 0 else 0.0

    @property
    def catch_up_s(self) -> float:
        """Seconds per token of the drafter's catch-up (0 until one ran)."""
        return self.caught[1] / self.caught[0] if self.caught[0] else 0.0

    def observe(self, tree: DraftTree, accepted: int, draft_s: float, target_s: float, caught_up: int = 0,
                catch_up_s: float = 0.0, wall_s: float | None = None, recorded: bool = False) -> None:
        """Learn from a finished round (a plain one too: it drafted PLAIN): calibration of the gain (against
        what choose() predicted for the size it picked), and the real costs, the catch-up of `caught_up`
        tokens before it included. wall_s: the whole round's host seconds, catch-up included (default: its
        draft + target, as a decoder that runs rounds ahead passes them: device seconds on a GPU). The engine's
        first round teaches no costs: its times hold one-off work (the size it drafted kept a 2x drafting cost,
        never drafted again to correct it); nor does a round that `recorded` programs (its wall time holds the
        recording: a reply's first penalised rounds chose plain steps for good)."""
        predicted = self.predicted
        self.rounds += 1
        costs = self.rounds > 1 and not recorded
        if costs and caught_up:  # NOTE: weighted by tokens: a long catch-up costs less per token
            self.caught = [0.8 * self.caught[0] + caught_up, 0.8 * self.caught[1] + catch_up_s]
        # NOTE: without run-ahead, rounds compare by wall time: a plain step pays the round's host work for one token
        s = draft_s + target_s if wall_s is None else max(wall_s - catch_up_s, 1e-9)
        if costs and self.drafted == PLAIN:
            self.plain_s = s if self.plain_s == 0 else 0.8 * self.plain_s + 0.2 * s
        elif costs:
            self._observe_costs(tree.size - 1, draft_s, target_s)
            self.trees = [TREE_DECAY * self.trees[0] + accepted, TREE_DECAY * self.trees[1] + s]
            if self.last == PLAIN and accepted / s > SOONER * self.plain_rate():
                # NOTE: an exploring tree that beat plain steps clearly: look again sooner (trees may pay now)
                self.interval = min(self.interval, EXPLORE_MAX)
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
