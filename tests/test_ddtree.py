"""DDTree / DFlash are lossless against AR, trees are the true top-budget prefixes, commits are exact."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ddtree_chat.engine import Engine, GenerationConfig
from ddtree_chat.engine.errors import ContextLengthError

from drafters import TargetDrafter, closure_mask
from tree_oracle import build_tree_heap, packed_mask, walk


@pytest.fixture(scope="module")
def eng(synthetic_pair):
    e = Engine.load(*synthetic_pair, device="cpu")
    yield e
    e.decoder.__dict__.pop("block_logits", None)


def ids_of(engine, prompt, **kw):
    kw.setdefault("stop_token_ids", ())
    return list(engine.generate(prompt, GenerationConfig(**kw)))[-1]


PROMPTS = ["def f(x):", "hello, world", "日本語 and emoji 🎉", "a"]


@pytest.mark.parametrize("budget", [1, 2, 7, 16, 64, 256])
def test_ddtree_equals_ar_with_random_drafter(eng, budget):
    for text in PROMPTS[:2]:
        prompt = eng.tokenizer.encode(text)
        ar = ids_of(eng, prompt, mode="ar", max_new_tokens=20)["token_ids"]
        assert ids_of(eng, prompt, mode="ddtree", budget=budget, max_new_tokens=20)["token_ids"] == ar
    assert ids_of(eng, prompt, mode="dflash", max_new_tokens=20)["token_ids"] == ar


@pytest.mark.parametrize("noise,budget", [(0.0, 7), (0.3, 4), (0.3, 16), (0.6, 64), (0.5, 256)])
def test_lossless_with_partial_acceptance(eng, noise, budget):
    eng.decoder.block_logits = TargetDrafter(eng, noise=noise, seed=budget)
    try:
        for text in PROMPTS:
            prompt = eng.tokenizer.encode(text)
            ar = ids_of(eng, prompt, mode="ar", max_new_tokens=30)["token_ids"]
            dd = ids_of(eng, prompt, mode="ddtree", budget=budget, max_new_tokens=30)
            assert dd["token_ids"] == ar
            assert ids_of(eng, prompt, mode="dflash", max_new_tokens=30)["token_ids"] == ar
    finally:
        del eng.decoder.block_logits
    if noise == 0.0:
        assert dd["mean_accepted_length"] > 4


def test_oracle_accepts_whole_blocks_and_useless_accepts_one(eng):
    prompt = eng.tokenizer.encode("oracle")
    b = eng.dcfg.block_size
    eng.decoder.block_logits = TargetDrafter(eng)
    try:
        rounds = [ev for ev in eng.generate(prompt, GenerationConfig(mode="dflash", max_new_tokens=4 * b + 1,
                                                                      stop_token_ids=())) if ev["event"] == "round"]
        assert [r["accepted_length"] for r in rounds[1:]] == [b] * 4
        eng.decoder.block_logits = TargetDrafter(eng, useless=True)
        done = ids_of(eng, prompt, mode="ddtree", budget=8, max_new_tokens=10)
        assert done["acceptance_histogram"] == {"1": 9}
    finally:
        del eng.decoder.block_logits
    assert done["token_ids"] == ids_of(eng, prompt, mode="ar", max_new_tokens=10)["token_ids"]


def test_stop_token_inside_accepted_path(eng):
    prompt = eng.tokenizer.encode("stop here")
    ar = ids_of(eng, prompt, mode="ar", max_new_tokens=20)["token_ids"]
    stop = next(t for i, t in enumerate(ar) if i >= 3 and t not in ar[:i])  # first occurrence past a round start
    want = ar[: ar.index(stop) + 1]
    eng.decoder.block_logits = TargetDrafter(eng)
    try:
        dd = ids_of(eng, prompt, mode="ddtree", budget=16, max_new_tokens=20, stop_token_ids=(stop,))
    finally:
        del eng.decoder.block_logits
    assert dd["token_ids"] == want and dd["stop_reason"] == "stop_token"
    assert eng.decoder.tokens + [eng.decoder.pending] == prompt + want  # nothing after the stop is committed


def test_multi_turn_reuses_cache_and_stays_lossless(eng, synthetic_pair):
    tok = eng.tokenizer
    eng.decoder.block_logits = TargetDrafter(eng, noise=0.3)
    messages = [{"role": "user", "content": "first question"}]
    try:
        for turn in range(3):
            ids = tok.render_chat(messages)
            dd = ids_of(eng, ids, mode="ddtree", budget=16, max_new_tokens=15)
            fresh = Engine.load(*synthetic_pair, device="cpu")  # no cache to reuse
            assert dd["token_ids"] == ids_of(fresh, ids, mode="ar", max_new_tokens=15)["token_ids"]
            messages += [{"role": "assistant", "content": tok.decode(dd["token_ids"])},
                         {"role": "user", "content": f"follow-up {turn}"}]
    finally:
        del eng.decoder.block_logits


def test_commit_leaves_the_cache_ar_would_build(eng, synthetic_pair):
    prompt = eng.tokenizer.encode("cache check")
    eng.decoder.block_logits = TargetDrafter(eng, noise=0.3)
    try:
        ids_of(eng, prompt, mode="ddtree", budget=16, max_new_tokens=25)
    finally:
        del eng.decoder.block_logits
    ref = Engine.load(*synthetic_pair, device="cpu")
    ids_of(ref, prompt, mode="ar", max_new_tokens=25)
    a, b = eng.decoder, ref.decoder
    assert a.tokens == b.tokens and a.pending == b.pending and a.cache.length == b.cache.length
    n = a.cache.length
    assert torch.allclose(a.cache.ckv[:, :n], b.cache.ckv[:, :n], atol=1e-5)
    assert torch.allclose(a.cache.kpe[:, :n], b.cache.kpe[:, :n], atol=1e-5)
    assert a.dcache.length == n and b.dcache.length == 0  # an `ar` reply keeps no drafter context


def test_a_drafting_reply_after_ar_replies_catches_the_drafter_up(synthetic_pair):
    """`ar` replies leave the drafter's context behind (plain decoding pays nothing for it); the next
    drafting reply's prefill recomputes the positions it lacks, and its tokens still equal `ar`'s."""
    eng, ref = Engine.load(*synthetic_pair, device="cpu"), Engine.load(*synthetic_pair, device="cpu")
    first = eng.tokenizer.encode("first turn")
    reply = ids_of(eng, first, mode="ar", max_new_tokens=12)["token_ids"]
    dec = eng.decoder
    assert dec.dcache.length == 0 and dec.dcache.end_pos == 0 and dec.cache.length == len(first) + len(reply) - 1
    second = first + reply + eng.tokenizer.encode(" and more")
    got = ids_of(eng, second, mode="ddtree", budget=16, max_new_tokens=20)["token_ids"]
    assert got == ids_of(ref, second, mode="ar", max_new_tokens=20)["token_ids"]
    assert dec.dcache.end_pos == dec.cache.length > len(second)  # caught up at the prefill, kept since
    assert dec.dcache.length == min(dec.cache.length, dec.dcache.capacity)


def test_prompt_longer_than_context_is_a_clear_error(synthetic_pair):
    small = Engine.load(*synthetic_pair, device="cpu", max_context=32)
    with pytest.raises(ContextLengthError, match="context holds 32"):
        ids_of(small, list(range(40)), mode="ar", max_new_tokens=4)
    done = ids_of(small, list(range(20)), mode="ddtree", budget=16, max_new_tokens=100)
    assert done["stop_reason"] == "context"


@pytest.mark.parametrize("mode, budget", [("ddtree", 16), ("ddtree", "auto"), ("dflash", None)])
def test_a_reply_fills_the_context_to_its_last_slot(synthetic_pair, mode, budget):
    """Near the end of the context a round's tree or block no longer fits: plain steps fill the last
    slots (the reply used to stop up to a tree's size early), with the tokens of `ar`; those rounds'
    events say so (mode "ar", budget 0), the reply's done event keeps its mode."""
    small = Engine.load(*synthetic_pair, device="cpu", max_context=32)
    prompt = list(range(20))
    kw = {} if budget is None else {"budget": budget}
    events = list(small.generate(prompt, GenerationConfig(mode=mode, max_new_tokens=100, stop_token_ids=(), **kw)))
    done = events[-1]
    want = ids_of(small, prompt, mode="ar", max_new_tokens=100, stop_token_ids=())
    assert done["stop_reason"] == want["stop_reason"] == "context" and done["mode"] == mode
    modes = [e["mode"] for e in events[1:-1] if e["event"] == "round"]  # after the prefill's
    assert modes[-1] == "ar" and set(modes) <= {mode, "ar"}
    if budget != "auto":  # NOTE: auto's plain steps may come before the context's end too
        assert modes == sorted(modes, key=lambda m: m == "ar")
    assert all(e["budget"] == 0 for e in events[1:-1] if e.get("mode") == "ar")
    assert len(done["token_ids"]) == 32 - len(prompt) + 1  # every slot committed, plus the pending token
    assert done["token_ids"] == want["token_ids"]


# -- tree construction ---------------------------------------------------------------------------

def _brute_force_scores(lp: list[list[float]]) -> list[float]:
    out, frontier = [], [((), 0.0)]
    for d in range(len(lp)):
        frontier = [(r + (k,), s + lp[d][k]) for r, s in frontier for k in range(len(lp[d]))]
        out += [s for _, s in frontier]
    return sorted(out, reverse=True)


@settings(max_examples=150, deadline=None)
@given(depth=st.integers(1, 4), k=st.integers(1, 4), budget=st.integers(0, 60), seed=st.integers(0, 10_000),
       start=st.integers(0, 1000))
def test_tree_is_the_top_budget_prefixes(depth, k, budget, seed, start):
    g = torch.Generator().manual_seed(seed)
    lp = torch.log_softmax(torch.randn(depth, 9, generator=g), -1).sort(-1, descending=True)
    vals, ids = lp.values[:, :k], lp.indices[:, :k]
    tree = build_tree_heap(777, vals, ids, budget)
    n = tree.size - 1
    best = _brute_force_scores(vals.tolist())
    assert n == min(budget, len(best))
    parents, depths, toks = tree.parents.tolist(), tree.depth.tolist(), tree.tokens.tolist()
    scores = [0.0]
    for i in range(1, tree.size):
        assert 0 <= parents[i] < i and depths[i] == depths[parents[i]] + 1 <= depth
        scores.append(scores[parents[i]] + tree.logprobs[i].item())
        row = vals[depths[i] - 1]
        same = (row == tree.logprobs[i]).nonzero().flatten()  # the rank(s) with exactly this log-prob
        assert toks[i] in ids[depths[i] - 1][same].tolist()
    assert sorted(scores[1:], reverse=True) == pytest.approx(best[:n], abs=1e-5)
    assert torch.equal(tree.mask(), _closure(tree))
    assert tree.positions(start).tolist() == [start + d for d in depths]
    packed = packed_mask(tree)
    unpacked = ((packed.unsqueeze(-1) >> torch.arange(64)) & 1).flatten(1)[:, : tree.size].bool()
    assert torch.equal(unpacked, tree.mask())


def test_walk_follows_target_choices():
    vals = torch.log_softmax(torch.tensor([[3.0, 2.0, 1.0], [3.0, 2.0, 1.0]]), -1)
    ids = torch.tensor([[10, 11, 12], [20, 21, 22]])
    tree = build_tree_heap(5, vals, ids, 6)
    toks = tree.tokens.tolist()
    choice = torch.zeros(tree.size, dtype=torch.long)
    choice[0] = 11  # root -> the rank-1 child
    n11 = toks.index(11)
    choice[n11] = 99  # not drafted: stop there, 99 is the bonus
    path, bonus = walk(tree, choice)
    assert path == [0, n11] and bonus == 99


# -- T > 0: the emitted distribution is the target's --------------------------------------------

def _chi2_pvalue(stat: float, dof: int) -> float:
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))  # Wilson-Hilferty
    return 0.5 * math.erfc(z / math.sqrt(2))


def _target_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    p = torch.softmax(logits / temperature, -1)
    order = p.argsort(descending=True)
    cum = torch.cumsum(p[order], 0)
    keep = order[: int((cum < top_p).sum()) + 1]
    q = torch.zeros_like(p)
    q[keep] = p[keep]
    return q / q.sum()


@pytest.mark.parametrize("temperature, top_p", [(0.8, 1.0), (0.5, 0.9)])
def test_sampled_replies_are_plain_decodings_tokens_in_every_mode(eng, temperature, top_p):
    """At T > 0 every mode emits the tokens ar samples for the same seed (draws keyed by position, and a node's
    logits are the AR step's), not only the same distribution; drafts the target often agrees with (greedy
    drafts with noise), and a penalty too."""
    eng.decoder.block_logits = TargetDrafter(eng, noise=0.3, seed=1)
    try:
        accepted = 0
        for text in PROMPTS[:2]:
            prompt = eng.tokenizer.encode(text)
            for seed, penalty in ((0, 1.0), (5, 1.3)):
                kw = dict(temperature=temperature, top_p=top_p, seed=seed, repeat_penalty=penalty, max_new_tokens=40)
                want = ids_of(eng, prompt, mode="ar", **kw)["token_ids"]
                assert ids_of(eng, prompt, mode="ar", **dict(kw, seed=seed + 1))["token_ids"] != want  # seeded
                for mode, budget in (("ddtree", 16), ("ddtree", 3), ("dflash", 0), ("ddtree", "auto")):
                    done = ids_of(eng, prompt, mode=mode, budget=budget, **kw)
                    assert done["token_ids"] == want, (text, seed, mode, budget)
                    accepted += done["rounds"] < len(want) - 1
        assert accepted > 10  # trees were accepted beyond their roots, not ar in disguise
    finally:
        del eng.decoder.block_logits


def test_sampled_distribution_matches_target(eng):
    """Joint law of the first three tokens (the third comes through an accepted tree node) vs the
    target's own tempered/top-p law, chi-square with fixed seeds (false-failure rate ~1e-3). 500 runs: ~18 cells
    expected 5 or more times (31 at 1200, which took 150 s on an AVX2 CPU)."""
    temp, top_p, runs = 0.2, 0.9, 500
    prompt = eng.tokenizer.encode("sampling")
    eng.decoder.block_logits = TargetDrafter(eng, noise=0.2)
    counts: dict[tuple[int, ...], int] = {}
    accepted = 0
    try:
        for seed in range(runs):
            done = ids_of(eng, prompt, mode="ddtree", budget=8, temperature=temp, top_p=top_p, seed=seed,
                          max_new_tokens=3)
            counts[tuple(done["token_ids"])] = counts.get(tuple(done["token_ids"]), 0) + 1
            accepted += done["rounds"] == 1
    finally:
        del eng.decoder.block_logits
    assert accepted > runs // 4  # the third token often came from an accepted node, not a second round

    def probs(prefix):
        return _target_probs(eng.logits(prompt + list(prefix))[-1], temp, top_p)

    expected: dict[tuple[int, ...], float] = {}
    p1 = probs(())
    for t1 in {c[0] for c in counts} | set(p1.topk(3).indices.tolist()):
        p2 = probs((t1,))
        for t2 in {c[1] for c in counts if c[0] == t1} | set(p2.topk(3).indices.tolist()):
            p3 = probs((t1, t2))
            for t3 in p3.nonzero().flatten().tolist():
                expected[(t1, t2, t3)] = p1[t1].item() * p2[t2].item() * p3[t3].item() * runs
    big = [c for c, e in expected.items() if e >= 5]
    stat, rest_obs, rest_exp = 0.0, runs, runs
    for cell in big:
        o, e = counts.get(cell, 0), expected[cell]
        stat += (o - e) ** 2 / e
        rest_obs, rest_exp = rest_obs - o, rest_exp - e
    stat += (rest_obs - rest_exp) ** 2 / max(rest_exp, 1.0)
    assert len(big) >= 5
    assert _chi2_pvalue(stat, len(big)) > 1e-3, (stat, len(big))


@settings(max_examples=150, deadline=None)
@given(depth=st.integers(1, 5), k=st.integers(1, 5), budget=st.integers(1, 80), seed=st.integers(0, 10_000))
def test_tensor_tree_build_and_walk_match_the_reference(depth, k, budget, seed):
    from ddtree_chat.engine.tree import build_tree, walk_topk

    g = torch.Generator().manual_seed(seed)
    lp = torch.log_softmax(torch.randn(depth, 9, generator=g), -1).sort(-1, descending=True)
    vals, ids = lp.values[:, :k], lp.indices[:, :k]
    ref, fast = build_tree_heap(5, vals, ids, budget), build_tree(5, vals, ids, budget)
    assert fast.size == ref.size
    parents = fast.parents.tolist()
    assert parents[0] == -1 and all(0 <= parents[i] < i for i in range(1, fast.size))
    assert torch.equal(fast.depth[1:], fast.depth[fast.parents[1:]] + 1)

    def prefixes(tree):
        toks, par = tree.tokens.tolist(), tree.parents.tolist()
        out = set()
        for i in range(1, tree.size):
            seq, j = [], i
            while j > 0:
                seq.append(toks[j])
                j = par[j]
            out.add(tuple(reversed(seq)))
        return out

    fast_scores, ref_scores = sorted(path_scores_of(fast)), sorted(path_scores_of(ref))
    assert fast_scores == pytest.approx(ref_scores, abs=1e-4)
    gaps = [b - a for a, b in zip(ref_scores, ref_scores[1:])]
    if all(g > 1e-4 for g in gaps):  # without (near-)ties the node sets are identical
        assert prefixes(fast) == prefixes(ref)
    assert torch.equal(fast.mask(), _closure(fast))
    choice = torch.randint(0, 9, (fast.size,), generator=g)
    for n in range(fast.size):  # let the target agree along a random path sometimes
        kids = [c for c in range(fast.size) if parents[c] == n]
        if kids and torch.rand(1, generator=g) < 0.7:
            choice[n] = fast.tokens[kids[int(torch.randint(0, len(kids), (1,), generator=g))]]
    path, bonus = walk(fast, choice)
    ok, bonus_t = walk_topk(fast, choice)
    assert ok.nonzero().flatten().tolist() == sorted(path) and int(bonus_t) == bonus


def path_scores_of(tree):
    from ddtree_chat.engine.tree import path_scores

    return path_scores(tree)[1:].tolist()


def _closure(tree):
    return closure_mask(tree.parents.tolist())


@pytest.mark.parametrize("budget", [-1, 0, 1024, 2.5, "big"])
def test_a_budget_outside_what_a_round_can_hold_is_refused(budget):
    """0 too: a ddtree round that drafts nothing is refused here as in the CLI and TUI (ar and dflash ignore
    the budget and report 0)."""
    with pytest.raises(ValueError, match="budget must be a number from 1 to 1023"):
        GenerationConfig(mode="ddtree", budget=budget)
    assert GenerationConfig(budget=1023).budget == 1023 and GenerationConfig(budget=1).budget == 1
    assert GenerationConfig(mode="ar", budget=0).budget == GenerationConfig(mode="dflash", budget=0).budget == 0


@pytest.mark.parametrize("vocab, scale", [(8192, 1.0), (8192, 4.0), (8192, 12.0), (50, 3.0), (2000, 0.5)])
def test_nucleus_from_the_top_k_equals_the_full_sort(vocab, scale):
    """sampling.nucleus looks among the top 64 or 1024 tokens first: the kept tokens and their probabilities are
    those of the full sort's nucleus, for flat rows (the fallback) and peaked ones alike, any vocabulary."""
    from ddtree_chat.engine.sampling import nucleus

    probs = torch.softmax(torch.randn(9, vocab, generator=torch.Generator().manual_seed(vocab)) * scale, -1)
    for top_p in (0.5, 0.9, 0.95):
        kept, ids = nucleus(probs, top_p)
        got = torch.zeros_like(probs).scatter_(-1, ids, kept)
        want = torch.stack([_target_probs(row.log(), 1.0, top_p) > 0 for row in probs])
        assert torch.equal(got > 0, want), (vocab, scale, top_p)
        assert torch.equal(got[want], probs[want])


def test_draw_picks_columns_in_proportion_to_their_weights():
    """sampling.draw (the exponential race, its noise hashed from seed, position and token): a zero weight is never
    drawn, the others as often as their share says over positions (chi-square, 2 degrees of freedom, p = 1e-3)."""
    from ddtree_chat.engine.sampling import draw

    w = torch.tensor([0.0, 1.0, 2.0, 5.0]).repeat(40_000, 1)
    for seed in (0, 2**40 + 3):
        got = torch.bincount(draw(w, torch.tensor(seed), torch.arange(w.shape[0])), minlength=4).double()
        want = w[0] / w[0].sum() * w.shape[0]
        assert got[0] == 0
        assert float(((got[1:] - want[1:]) ** 2 / want[1:]).sum()) < 13.8, (seed, got)


def test_a_draw_depends_on_its_seed_position_and_token_alone():
    """The noise of a row is the same alone or inside any launch, whatever order its candidates come in; another
    seed or position draws anew (so a tree node and the AR step at its position choose alike)."""
    from ddtree_chat.engine.sampling import race_noise

    seed, pos = torch.tensor(11), torch.arange(100, 109)
    ids = torch.randint(0, 163840, (9, 64), generator=torch.Generator().manual_seed(0))
    noise = race_noise(seed, pos, ids)
    for i in range(9):
        assert torch.equal(race_noise(seed, pos[i : i + 1], ids[i : i + 1])[0], noise[i])
        perm = torch.randperm(64, generator=torch.Generator().manual_seed(i))
        assert torch.equal(race_noise(seed, pos[i : i + 1], ids[i : i + 1, perm])[0], noise[i, perm])
    assert (race_noise(torch.tensor(12), pos, ids) != noise).double().mean() > 0.99
    assert (race_noise(seed, pos + 1, ids) != noise).double().mean() > 0.99
    assert bool((noise > 0).all()) and abs(float(noise.mean()) - 1.0) < 0.05  # Exp(1): mean 1


def test_the_nucleus_keeps_or_drops_ties_at_its_edge_whatever_their_order():
    """Equal probabilities at the top-p edge: all kept or all dropped, so the kept tokens do not depend on which
    of them a sort or a top-k put first (a tree row and an AR row may order ties differently)."""
    from ddtree_chat.engine.sampling import nucleus

    row = torch.tensor([0.4, 0.2, 0.2, 0.1, 0.1])
    perm = torch.tensor([3, 1, 4, 0, 2])
    probs = torch.stack([row, row[perm]])  # the same distribution, its tokens in another order
    for top_p, want in ((0.5, {0, 1, 2}), (0.3, {0}), (0.85, {0, 1, 2, 3, 4}), (0.7, {0, 1, 2})):
        kept, ids = nucleus(probs, top_p)
        for r in range(2):
            got = {int(t) for t, k in zip(ids[r], kept[r]) if k > 0}
            assert {int(perm[t]) for t in got} == want if r else got == want, (top_p, r, got)
