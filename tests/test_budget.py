"""--budget auto: a measured cost curve, a surrogate gain, lossless output."""

import math

import pytest
import torch

from ddtree_chat.engine import Engine, GenerationConfig
from ddtree_chat.engine.budget import PLAIN, AutoBudget
from ddtree_chat.engine.parallel import SINGLE
from ddtree_chat.engine.tree import path_scores

from drafters import TargetDrafter
from tree_oracle import build_tree_heap


def _tree(confident: bool):
    p = torch.tensor([[0.97, 0.02, 0.01]] * 7 if confident else [[0.4, 0.35, 0.25]] * 7)
    return build_tree_heap(0, p.log(), torch.arange(3).repeat(7, 1), 16)


def test_choice_trades_acceptance_against_measured_cost():
    auto = AutoBudget(decoder=None, tp=SINGLE, key="test")
    auto.costs = {2: 1.0, 4: 1.0, 8: 1.0, 16: 3.0}  # verify seconds per tree size
    # A confident chain: 7 nodes carry almost all the gain, so the cheap size that holds them wins.
    assert auto.choose(_tree(True)) == 8
    auto.costs = {2: 1.0, 4: 1.5, 8: 2.5, 16: 4.0}
    assert auto.choose(_tree(False)) == 2  # flat drafts gain little: the smallest tree
    scores = path_scores(_tree(True))
    assert torch.allclose(scores[1:8], torch.log(torch.tensor(0.97)) * torch.arange(1, 8))


def test_calibration_follows_observed_acceptance():
    auto = AutoBudget(decoder=None, tp=SINGLE, key="test")
    auto.costs = {16: 3.0, 32: 4.0}
    tree = _tree(True)
    for _ in range(50):
        assert auto.choose(tree) == 16  # (the engine calls choose, then observe, every round)
        auto.observe(tree.prefix(16), accepted=1, draft_s=0.01, target_s=1.0)  # the target never agrees
    assert auto.calib < 0.05
    # the cost of the size in use follows the real rounds, and every other size scales with it
    assert abs(auto.cost_scale * auto.costs[16] - 1.0) < 1e-3 and abs(auto.cost_scale * auto.costs[32] - 4 / 3) < 1e-3


def test_auto_is_lossless_and_reports_the_chosen_budget(engine):
    prompt = engine.tokenizer.encode("auto budget")
    engine.decoder.block_logits = TargetDrafter(engine, noise=0.3)
    try:
        evs = list(engine.generate(prompt, GenerationConfig(mode="ddtree", budget="auto", max_new_tokens=30,
                                                             stop_token_ids=())))
    finally:
        del engine.decoder.block_logits
    ar = list(engine.generate(prompt, GenerationConfig(mode="ar", max_new_tokens=30, stop_token_ids=())))
    assert evs[-1]["token_ids"] == ar[-1]["token_ids"]
    costs = engine.replies.auto.costs
    assert costs and all(v > 0 for v in costs.values())
    for ev in evs[1:-1]:  # a plain step (where the drafter's cost outweighs its trees) drafts nothing
        assert ev["budget"] in costs.keys() | {PLAIN} and len(ev["tree"]["tokens"]) == ev["budget"] + 1
        assert (ev["mode"] == "ar") == (ev["budget"] == PLAIN)


def test_drafted_size_climbs_by_cost_not_by_one_step():
    auto = AutoBudget(decoder=None, tp=SINGLE, key="test")
    auto.costs = {4: 1.0, 8: 1.6, 16: 1.7, 32: 1.9, 64: 2.1, 128: 4.0}
    auto.last = 4
    assert auto.next_budget() == 32  # 16 and 32 cost within 25% of 8's
    auto.costs = {b: 1.0 for b in auto.costs}  # flat (a GPU): the largest at once
    assert auto.next_budget() == 128
    auto.costs = {4: 1.0, 8: 2.0, 16: 4.0}  # steep (a CPU): one step
    assert auto.next_budget() == 8
    auto.last = 16
    assert auto.next_budget() == 16
    auto.costs, auto.last, auto.rounds = {4: 1.0, 8: 1.0, 16: 1.0}, 4, 3
    assert auto.next_budget() == 4  # between exploring rounds it drafts its last choice
    auto.rounds = 8
    assert auto.next_budget() == 16


def test_choice_counts_the_drafting_cost_of_each_size():
    auto = AutoBudget(decoder=None, tp=SINGLE, key="test")
    auto.costs = {4: 1.0, 8: 1.0, 16: 1.05}
    tree = _tree(True)
    assert auto.choose(tree) == 8  # the size that holds the confident chain
    auto.draft_costs = {4: 0.0, 8: 5.0, 16: 5.0}  # ... unless drafting it costs more than it gains
    assert auto.choose(tree) == 4


def test_explorations_come_rarer_while_they_confirm_the_choice():
    """Exploring rounds choose on the host (no run-ahead): each one that keeps the choice doubles the
    interval (8, 16, 32, 64 rounds), a changed choice goes back to every 8th round."""
    from ddtree_chat.engine.budget import EXPLORE, EXPLORE_MAX

    auto = AutoBudget(decoder=None, tp=SINGLE, key="test")
    auto.costs = {4: 1.0, 8: 1.0, 16: 1.05}
    tree = _tree(True)
    seen = []
    for r in range(400):
        auto.rounds = r
        if auto.exploring:
            auto.choose(tree)
            seen.append((r, auto.interval))
    assert [r for r, _ in seen][:7] == [0, 8, 16, 32, 64, 128, 192]  # 8 -> 16 -> 32 -> 64 (capped)
    assert max(i for _, i in seen) == EXPLORE_MAX
    auto.draft_costs = {4: 0.0, 8: 5.0, 16: 5.0}  # the best size changes ...
    auto.rounds = 256
    assert auto.choose(tree) == 4 and auto.interval == EXPLORE  # ... so it explores every 8th round again


def test_kernel_fingerprint_follows_the_kernel_sources(tmp_path, monkeypatch):
    """--budget auto's cached verify costs are keyed by the GPU and this fingerprint (the kernel set and
    the kernel sources): another kernel set measures afresh."""
    from ddtree_chat.engine.ops import gpu

    before = gpu.fingerprint()
    assert before == gpu.fingerprint() and len(before) == 10
    monkeypatch.setattr(gpu, "enabled_ops", gpu.enabled_ops + ["probe"])
    assert gpu.fingerprint() != before
    # the sources: a package laid out as engine/ops/*.py next to csrc/*.cu (gpu.py finds them from its file)
    ops_dir, csrc = tmp_path / "pkg" / "engine" / "ops", tmp_path / "pkg" / "csrc"
    ops_dir.mkdir(parents=True)
    csrc.mkdir()
    (ops_dir / "kernel.py").write_text("A = 1\n")
    (csrc / "kernel.cu").write_text("// v1\n")
    monkeypatch.setattr(gpu, "__file__", str(ops_dir / "gpu.py"))
    first = gpu.fingerprint()
    (csrc / "kernel.cu").write_text("// v2\n")
    second = gpu.fingerprint()
    (ops_dir / "kernel.py").write_text("A = 2\n")
    assert len({first, second, gpu.fingerprint()}) == 3


def test_a_round_that_cuts_its_tree_leaves_the_drafted_size():
    """Eager rounds choose every round: an uncertain tree is cut small for that round only; the size the
    next rounds draft moves at exploring rounds alone."""
    auto = AutoBudget(decoder=None, tp=SINGLE, key="test")
    auto.costs = {2: 1.0, 4: 1.2, 8: 1.5, 16: 3.0}
    assert auto.exploring and auto.choose(_tree(True)) == 8
    auto.costs = {2: 1.0, 4: 1.5, 8: 2.5, 16: 4.0}
    auto.rounds = 1  # not an exploring round
    assert not auto.exploring and auto.choose(_tree(False)) == 2  # this round verifies 2 nodes ...
    assert auto.next_budget() == 8  # ... the next one drafts 8 again
    auto.rounds = auto.interval  # an exploring round moves it
    auto.choose(_tree(False))
    auto.rounds += 1
    assert auto.next_budget() == 2


def test_the_first_round_teaches_no_costs():
    """The engine's first round carries one-off work (allocations, first calls): its times are not learned."""
    auto = AutoBudget(decoder=None, tp=SINGLE, key="test")
    auto.costs = {8: 1.0, 16: 2.0}
    auto.drafted = 8
    auto.observe(_tree(True).prefix(8), accepted=3, draft_s=9.0, target_s=9.0)
    assert auto.cost_scale == 1.0 and auto.draft_s == 0.0 and not auto.draft_costs
    auto.observe(_tree(True).prefix(8), accepted=3, draft_s=0.5, target_s=2.0)
    assert auto.draft_costs == {8: 0.5} and abs(auto.cost_scale - 1.2) < 1e-9


def test_a_round_that_recorded_programs_teaches_no_costs():
    """A round's wall time holds the recording of programs it used first: neither a tree's nor a plain step's."""
    auto = AutoBudget(decoder=None, tp=SINGLE, key="test")
    auto.costs, auto.drafted = {8: 1.0}, 8
    auto.observe(_tree(True).prefix(8), accepted=3, draft_s=0.5, target_s=2.0)  # the first round: never learned
    auto.observe(_tree(True).prefix(8), accepted=3, draft_s=0.5, target_s=2.0, wall_s=9.0, recorded=True)
    auto.drafted = PLAIN
    auto.observe(_tree(True).prefix(0), accepted=1, draft_s=0.0, target_s=0.5, wall_s=9.0, recorded=True)
    assert auto.trees == [0.0] * 2 and auto.plain_s == 0.0 and auto.cost_scale == 1.0 and auto.rounds == 3
    auto.observe(_tree(True).prefix(0), accepted=1, draft_s=0.0, target_s=0.5, wall_s=0.6)
    assert auto.plain_s == 0.6


def _simulate(auto, rounds: int, accepted: int) -> list[int]:
    """The reply loop's calls on a direct (CPU) path where a tree round takes 1.8 s and gives `accepted`
    tokens, a plain round 0.5 s, and the drafter's catch-up 0.05 s a token; the sizes each round drafted."""
    tree, drafted, missed = _tree(accepted > 1), [], 0
    for _ in range(rounds):
        b = auto.next_budget()
        drafted.append(b)
        if b == PLAIN:
            missed += 1
            auto.observe(tree.prefix(0), accepted=1, draft_s=0.0, target_s=0.5)
            continue
        n = auto.choose(tree)
        auto.observe(tree.prefix(n), accepted=min(accepted, n + 1), draft_s=0.8, target_s=1.0, caught_up=missed,
                     catch_up_s=0.05 * missed)
        missed = 0
    return drafted


def test_plain_steps_where_no_tree_pays_still_explore_and_go_back_to_trees():
    """Drafting costs most of a plain step and the target rarely agrees (T > 0 on a CPU): after the
    first explorations every round is a plain step but for an exploration every PLAIN_EXPLORE_MAX rounds
    (each one also pays the drafter's catch-up); an exploring tree that beats them by SOONER brings the next
    exploration within EXPLORE_MAX rounds, so once trees pay again they come back within a few explorations (the poor
    rounds still in the decaying sums hold their rate down until then)."""
    from ddtree_chat.engine.budget import EXPLORE_MAX, PLAIN_EXPLORE_MAX

    auto = AutoBudget(decoder=None, tp=SINGLE, key="test")
    auto.costs, auto.plain_cost = {2: 1.0, 4: 1.2, 8: 1.5}, 0.5
    poor = _simulate(auto, 400, accepted=1)
    assert auto.last == PLAIN and auto.interval == PLAIN_EXPLORE_MAX > EXPLORE_MAX
    late = poor[200:]
    assert 0 < sum(b != PLAIN for b in late) <= len(late) // PLAIN_EXPLORE_MAX + 1  # still explores, rarely
    assert auto.catch_up_s == pytest.approx(0.05)
    # 6 tokens in 1.8 s: trees beat 1 in 0.55 s; after the first such exploration they are checked every EXPLORE_MAX
    good = _simulate(auto, PLAIN_EXPLORE_MAX + 6 * EXPLORE_MAX, accepted=6)
    assert auto.last != PLAIN and all(b != PLAIN for b in good[-EXPLORE_MAX:])


def test_only_an_exploring_tree_clearly_faster_than_plain_steps_brings_the_next_exploration_closer():
    """Under plain steps (2 tokens/s), an exploring tree round at 1.2x their rate is luck at T > 0 and leaves the
    interval alone; one at 2x brings the next exploration within EXPLORE_MAX rounds."""
    from ddtree_chat.engine.budget import EXPLORE_MAX, PLAIN_EXPLORE_MAX, SOONER

    auto = AutoBudget(decoder=None, tp=SINGLE, key="test")
    auto.costs, auto.plain_cost = {2: 1.0, 4: 1.2, 8: 1.5}, 0.5
    auto.last, auto.interval, auto.rounds, auto.drafted = PLAIN, PLAIN_EXPLORE_MAX, 5, 8
    tree = _tree(False).prefix(8)
    auto.observe(tree, accepted=3, draft_s=0.5, target_s=0.75)  # 2.4 tokens/s
    assert 1.2 < SOONER and auto.interval == PLAIN_EXPLORE_MAX
    auto.observe(tree, accepted=5, draft_s=0.5, target_s=0.75)  # 4 tokens/s
    assert auto.interval == EXPLORE_MAX


def _trees(rate: float, tokens: list[int]) -> list[float]:
    """AutoBudget.trees of tree rounds that gave these tokens at `rate` tokens/s overall."""
    return [sum(tokens), sum(tokens) / rate]


def test_a_near_tie_keeps_the_choice_in_force_and_a_new_temperature_explores_afresh():
    auto = AutoBudget(decoder=None, tp=SINGLE, key="test")
    auto.costs, auto.plain_cost = {2: 1.0, 4: 1.2, 8: 1.5}, 0.5
    many = [2] * 1000
    auto.trees = _trees(1.96, many)  # tree rounds gave 1.96 tokens/s, plain steps would give 2
    assert auto.choose(_tree(False)) > 0 and auto.last != PLAIN
    auto.trees = _trees(1.67, many)
    auto.rounds = auto.interval
    auto.choose(_tree(False))
    assert auto.last == PLAIN
    auto.trees = _trees(2.04, many)  # the margin goes to the choice in force: 2.04 tokens/s do not leave plain steps
    auto.rounds = auto.interval
    auto.choose(_tree(False))
    assert auto.last == PLAIN
    auto.trees = _trees(2.22, many)  # 2.22 do
    auto.rounds = auto.interval
    auto.choose(_tree(False))
    assert auto.last != PLAIN
    auto.start_reply(0.0)  # the first reply: it was never told a temperature
    assert auto.last is None and auto.exploring and auto.tree_rate == 0.0
    auto.last, auto.trees = PLAIN, _trees(1.67, many)
    auto.start_reply(0.0)  # the same temperature: it keeps what it learnt
    assert auto.last == PLAIN and auto.tree_rate > 0


def _alternate(monkeypatch):
    """Every exploring round flips between plain steps and trees (each flip: 8 rounds of the other)."""
    flips = iter(range(10**6))
    monkeypatch.setattr(AutoBudget, "plain_rate", lambda self: math.inf if next(flips) % 2 == 0 else 0.0)


def test_plain_steps_and_trees_in_turn_keep_ar_ids_and_the_drafter_context(synthetic_pair, monkeypatch):
    """A drafting round after plain steps first recomputes the drafter context rows they skipped: the
    reply keeps `ar`'s ids, and the drafter's context equals the one a drafting prefill of the same
    tokens builds."""
    eng, ref = Engine.load(*synthetic_pair, device="cpu"), Engine.load(*synthetic_pair, device="cpu")
    _alternate(monkeypatch)
    prompt = eng.tokenizer.encode("plain steps, then trees")
    eng.decoder.block_logits = TargetDrafter(eng, noise=0.6)
    caught = []
    catch_up = eng.decoder._catch_up
    monkeypatch.setattr(eng.decoder, "_catch_up", lambda: caught.append(catch_up()) or caught[-1])
    evs = list(eng.generate(prompt, GenerationConfig(mode="ddtree", budget="auto", max_new_tokens=90,
                                                     stop_token_ids=())))
    want = list(ref.generate(prompt, GenerationConfig(mode="ar", max_new_tokens=90, stop_token_ids=())))
    assert evs[-1]["token_ids"] == want[-1]["token_ids"]
    modes = [ev["mode"] for ev in evs[1:-1]]
    assert modes[:25] == (["ddtree"] + ["ar"] * 7 + ["ddtree"] * 9 + ["ar"] * 7 + ["ddtree"])  # in turn
    assert all(ev["budget"] == 0 and len(ev["tree"]["tokens"]) == 1 for ev in evs[1:-1] if ev["mode"] == "ar")
    assert caught[:2] == [7, 7]  # each exploration after plain steps catches up on those alone
    dec = eng.decoder
    if dec.dcache.end_pos < dec.cache.length:
        dec._catch_up()
    ref.decoder.prefill(list(dec.tokens), drafting=True)  # every committed token's row, at once
    n = dec.cache.length
    assert dec.dcache.end_pos == ref.decoder.dcache.end_pos == n and dec.dcache.length == n
    for a, b in ((dec.dcache.k, ref.decoder.dcache.k), (dec.dcache.v, ref.decoder.dcache.v)):
        assert torch.allclose(a[:, :n].float(), b[:, :n].float(), atol=1e-3)


@pytest.mark.parametrize("ahead", [False, True])
def test_rounds_run_ahead_are_learned_by_their_own_seconds_not_the_host_wall(synthetic_pair, monkeypatch, ahead):
    """A decoder that runs rounds one ahead overlaps the host's work, so the auto budget learns each round's
    draft + target seconds (the device's, on a GPU); one that does not, the round's wall time. An exploring round's
    budget choice (a host wait for the draft) counts in neither part."""
    from ddtree_chat.engine import graphs

    eng = Engine.load(*synthetic_pair, device="cpu")
    eng.decoder.run_ahead = ahead
    walls = []
    observe = AutoBudget.observe
    monkeypatch.setattr(AutoBudget, "observe", lambda self, *a, **kw: walls.append(a[6]) or observe(self, *a, **kw))
    list(eng.generate(eng.tokenizer.encode("run ahead"), GenerationConfig(mode="ddtree", budget="auto",
                                                                          max_new_tokens=20, stop_token_ids=())))
    assert walls and all((w is None) == ahead for w in walls)
    clock = graphs._Clock(torch.device("cpu"))  # start, drafted, (the choice), verify, end
    clock.marks += [clock.marks[0] + 1.0, clock.marks[0] + 5.0, clock.marks[0] + 7.0]
    assert clock.split() == pytest.approx((1.0, 2.0))
    clock.marks[1:] = [clock.marks[0] + 1.0, clock.marks[0] + 3.0]  # start, verify, end
    assert clock.split() == pytest.approx((1.0, 2.0))
