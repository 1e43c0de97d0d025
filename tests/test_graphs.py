"""The round's programs (engine/graphs.py) and their two executors agree: run directly, and run as the
recorded path runs them (padded prompt chunks, rounds launched one ahead; on a GPU recorded as CUDA
graphs): the same tokens as `ar`, the same committed caches.

On CPU the `pair` fixture's second engine runs the recorded path's logic uncaptured, which checks its
math and bookkeeping; the GPU tests record it."""

import math
import os

import pytest
import torch

from ddtree_chat.engine import Engine, GenerationConfig
from ddtree_chat.engine.budget import AutoBudget
from ddtree_chat.engine.graphs import Variant, graph_key
from ddtree_chat.engine.sampling import target_choice
from ddtree_chat.modes import Mode

from drafters import TargetDrafter

PROMPTS = ["def f(x):", "hello, world", "a"]
LONG = "the drafter attends a wider span past 256 entries; " * 10  # > 256 tokens


def run(engine, prompt, **kw):
    kw.setdefault("stop_token_ids", ())
    return list(engine.generate(prompt, GenerationConfig(**kw)))[-1]


@pytest.fixture(scope="module")
def pair(synthetic_pair):
    eager = Engine.load(*synthetic_pair, device="cpu")
    static = Engine.load(*synthetic_pair, device="cpu")
    calls = []
    static.use_graphs(capture=False, progress=lambda *a: calls.append(a))
    # NOTE: as recorded rounds do (padded prompt chunks, rounds run ahead): that logic checked on the CPU
    static.decoder.graphs.pads_prefill, static.decoder.run_ahead = True, True
    # the loading screen's second step: one call per recorded round kind, counting up to a fixed total
    from ddtree_chat.engine.progress import Stage
    total = calls[-1][1]
    assert total >= 3 and calls == [(i + 1, total, Stage.RECORDING) for i in range(total)]
    assert all(c[2] is Stage.RECORDING for c in calls)
    return eager, static


def with_drafter(engine, drafter):
    engine.decoder.block_logits = drafter
    engine.decoder.run_ahead = False  # NOTE: these drafters read the host's committed tokens


def drop_drafter(engine, run_ahead=True):
    engine.decoder.__dict__.pop("block_logits", None)
    engine.decoder.run_ahead = run_ahead


def test_directly_run_programs_prefer_library_products(pair, monkeypatch):
    """Programs run directly (here every one: CPU) run under registry.prefer_library() (on a GPU their
    float32 products take cuBLAS: a Triton launch costs host time, which a graph replay does
    not pay); recorded programs keep the kernels (the GPU tests record them)."""
    import importlib

    from ddtree_chat.engine.ops import registry

    linear = importlib.import_module("ddtree_chat.engine.ops.linear")  # NOTE: ops exports a function of that name
    seen = []
    run = linear.MATMUL_NT.run
    monkeypatch.setattr(linear.MATMUL_NT, "run", lambda *a: seen.append(registry.prefers_library()) or run(*a))
    events = pair[1].generate([1, 2, 3, 4, 5], GenerationConfig(mode="ddtree", budget=4, max_new_tokens=12,
                                                                stop_token_ids=()))
    next(events)  # the prefill's event
    prefill = len(seen)
    assert len(list(events)) > 2 and prefill > 0 and len(seen) > prefill and set(seen) == {True}
    assert not registry.prefers_library()


@pytest.mark.parametrize("mode,budget", [("ar", 0), ("dflash", 7), ("ddtree", 1), ("ddtree", 16),
                                         ("ddtree", 64), ("ddtree", "auto")])
def test_static_round_equals_eager_round_with_the_real_drafter(pair, mode, budget):
    eager, static = pair
    for text in PROMPTS[:2]:
        prompt = eager.tokenizer.encode(text)
        want = run(eager, prompt, mode="ar", max_new_tokens=20)["token_ids"]
        got = run(static, prompt, mode=mode, budget=budget, max_new_tokens=20)
        assert got["token_ids"] == want
        assert got["mode"] == mode


@pytest.mark.parametrize("mode,budget", [("ar", 0), ("dflash", 7), ("ddtree", 4), ("ddtree", 16)])
def test_running_a_round_ahead_changes_nothing(pair, mode, budget):
    """The next round launched on the device state accept() leaves == launched from the host's state."""
    _, static = pair
    dec = static.decoder
    launches = []
    launch = dec._launch
    dec._launch = lambda *a, fresh, **kw: launches.append(fresh) or launch(*a, fresh=fresh, **kw)
    try:
        for text in PROMPTS + [LONG]:
            prompt = static.tokenizer.encode(text)
            dec.run_ahead = False
            want = run(static, prompt, mode=mode, budget=budget, max_new_tokens=40)
            state = (list(dec.tokens), dec.cache.length, dec.dcache.length, dec.dcache.end_pos)
            dec.run_ahead, launches[:] = True, []
            got = run(static, prompt, mode=mode, budget=budget, max_new_tokens=40)
            assert got["token_ids"] == want["token_ids"]
            assert got["acceptance_histogram"] == want["acceptance_histogram"]
            assert (list(dec.tokens), dec.cache.length, dec.dcache.length, dec.dcache.end_pos) == state
            assert launches.count(True) == 1 and launches.count(False) == got["rounds"]  # all but the first ran ahead
    finally:
        del dec._launch


@pytest.mark.parametrize("mode,budget,penalty", [("ar", 0, 1.0), ("ddtree", 16, 1.0), ("ar", 0, 1.3),
                                                  ("ddtree", 16, 1.3)])
def test_sampled_rounds_run_ahead_with_the_seeds_draws(pair, mode, budget, penalty):
    """At T > 0 too the next round is launched on the device state before this one's result is read: its draws
    are keyed by the positions it reads there, so a seed gives the ids it gives rounds launched one by one (under a
    repeat penalty as well: a round launched ahead reads the window the round before it committed on the device;
    past the window's 64 tokens a stale window shows)."""
    _, static = pair
    dec = static.decoder
    launches = []
    launch = dec._launch
    dec._launch = lambda *a, fresh, **kw: launches.append(fresh) or launch(*a, fresh=fresh, **kw)
    n = 40 if penalty == 1 else 100
    cfg = dict(mode=mode, budget=budget, max_new_tokens=n, temperature=0.8, top_p=0.95, seed=5, repeat_penalty=penalty)
    try:
        for text in PROMPTS:
            prompt = static.tokenizer.encode(text)
            dec.run_ahead = False
            want = run(static, prompt, **cfg)
            dec.run_ahead, launches[:] = True, []
            got = run(static, prompt, **cfg)
            assert got["token_ids"] == want["token_ids"] and len(got["token_ids"]) == n
            assert launches.count(True) == 1 and launches.count(False) == got["rounds"]  # all but the first ran ahead
    finally:
        del dec._launch


def test_auto_budget_runs_ahead_between_exploring_rounds(pair):
    """--budget auto on the graph path: exploring rounds choose (a fresh launch each), the rounds between
    verify the last choice whole and run one ahead, and nothing launched ahead is thrown away (the
    round before an exploring one launches nothing ahead; the one after is launched by the exploring
    round, at its choice); the ids stay ar's."""
    eager, static = pair
    dec = static.decoder
    launches = []
    launch = dec._launch
    dec._launch = lambda *a, fresh, **kw: launches.append((fresh, a[5] is not None)) or launch(*a, fresh=fresh, **kw)
    try:
        prompt = eager.tokenizer.encode(LONG)
        want = run(eager, prompt, mode="ar", max_new_tokens=60)["token_ids"]
        got = run(static, prompt, mode="ddtree", budget="auto", max_new_tokens=60)
        assert got["token_ids"] == want
        ahead = [c for fresh, c in launches if not fresh]
        assert ahead and not any(ahead)  # some rounds ran ahead, never a choosing one
        assert all(fresh for fresh, c in launches if c)  # every choosing round was launched fresh
        assert sum(c for _, c in launches) <= got["rounds"] // 8 + 2  # about one round in EXPLORE chose
        # no fixed round had to be launched afresh, but the reply's first (when an earlier reply chose)
        assert sum(fresh and not c for fresh, c in launches) <= 1
        assert len(launches) <= got["rounds"] + 1  # at most the one launched past the reply's end is unread
    finally:
        del dec._launch


def test_auto_plain_steps_run_ahead_and_the_drafter_catches_up_from_their_kept_features(pair, monkeypatch):
    """--budget auto turning from trees to plain steps and back on the graph path's logic: the tree round
    that chose plain steps launches the first one ahead and each launches the next, keeping its root's target
    features; the drafting round after them projects those into the drafter's context, with no target forward
    (no prefill chunk runs but the prompt's), to the context that recomputing them through padded prefill
    chunks makes; the ids stay ar's."""
    eager, static = pair
    dec = static.decoder
    launches, caught, chunks = [], [], []
    launch, catch_up, prefill_chunks = dec._launch, dec._catch_up, dec._prefill_chunks
    monkeypatch.setattr(dec, "_launch", lambda *a, fresh, **kw: launches.append((a[0], fresh)) or launch(*a, fresh=fresh, **kw))
    monkeypatch.setattr(dec, "_catch_up", lambda: caught.append(catch_up()) or caught[-1])
    monkeypatch.setattr(dec, "_prefill_chunks", lambda *a: chunks.append(a) or prefill_chunks(*a))
    prompt = eager.tokenizer.encode(LONG)
    want = run(eager, prompt, mode="ar", max_new_tokens=60)["token_ids"]

    def reply():
        flips = iter(range(10**6))  # every exploring round flips between plain steps and trees
        monkeypatch.setattr(AutoBudget, "plain_rate", lambda self: math.inf if next(flips) % 2 == 0 else 0.0)
        monkeypatch.setattr(static.replies, "auto", None)  # a fresh auto budget: its first round explores
        launches.clear(), caught.clear(), chunks.clear()
        got = run(static, prompt, mode="ddtree", budget="auto", max_new_tokens=60)
        n = dec.dcache.length
        return got["token_ids"], dec.dcache.k[:, :n].clone(), dec.dcache.v[:, :n].clone()

    ids, k, v = reply()
    assert ids == want
    plain = [fresh for mode, fresh in launches if mode is Mode.AR]
    assert len(plain) >= 14 and not any(plain)  # every plain step was launched ahead
    assert len(caught) >= 2 and set(caught) == {7} and len(chunks) == 1  # the prompt's chunks only
    monkeypatch.setattr(dec, "_catch_up_kept", lambda: 0)  # the same reply, catching up through the target
    ids2, k2, v2 = reply()
    assert ids2 == want and set(caught) == {7} and len(chunks) == 1 + len(caught)
    assert torch.allclose(k, k2, atol=1e-5) and torch.allclose(v, v2, atol=1e-5)


def test_a_chat_turn_after_auto_plain_steps_prefills_only_its_new_tokens(pair, monkeypatch):
    """An auto reply that ends in plain steps leaves their features kept; the next turn (the conversation so far
    plus new text) catches the drafter up from them in its prefill and runs only the new tokens through the
    target; its reply is ar's."""
    eager, static = pair
    dec = static.decoder
    monkeypatch.setattr(AutoBudget, "plain_rate", lambda self: math.inf)  # plain steps after the first exploration
    monkeypatch.setattr(static.replies, "auto", None)
    prompt = eager.tokenizer.encode(PROMPTS[0])
    first = run(static, prompt, mode="ddtree", budget="auto", max_new_tokens=40)["token_ids"]
    assert dec.kept_from is not None and dec.dcache.end_pos < dec.cache.length  # ended in plain steps
    follow = prompt + first + eager.tokenizer.encode(" and then")
    chunks = []
    prefill_chunks = dec._prefill_chunks
    monkeypatch.setattr(dec, "_prefill_chunks", lambda *a: chunks.append(len(a[0])) or prefill_chunks(*a))
    got = run(static, follow, mode="ddtree", budget="auto", max_new_tokens=30)["token_ids"]
    assert chunks == [len(follow) - len(prompt) - len(first) + 1]  # the new text and the last reply token
    assert dec.dcache.end_pos >= len(follow)  # the drafter's context covers the whole turn
    assert got == run(eager, follow, mode="ar", max_new_tokens=30)["token_ids"]


@pytest.mark.parametrize("noise,budget", [(0.0, 7), (0.3, 16), (0.6, 64)])
def test_static_round_commits_partial_paths_exactly(pair, noise, budget):
    eager, static = pair
    for e in pair:
        with_drafter(e, TargetDrafter(e, noise=noise, seed=budget))
    try:
        for text in PROMPTS:
            prompt = eager.tokenizer.encode(text)
            want = run(eager, prompt, mode="ddtree", budget=budget, max_new_tokens=30)
            got = run(static, prompt, mode="ddtree", budget=budget, max_new_tokens=30)
            assert got["token_ids"] == want["token_ids"]
            assert got["acceptance_histogram"] == want["acceptance_histogram"]  # the same rounds
            a, b = static.decoder, eager.decoder
            assert a.tokens == b.tokens and a.pending == b.pending and a.cache.length == b.cache.length
            n = a.cache.length
            assert torch.allclose(a.cache.ckv[:, :n], b.cache.ckv[:, :n], atol=1e-5)
            assert torch.allclose(a.cache.kpe[:, :n], b.cache.kpe[:, :n], atol=1e-5)
            assert a.dcache.length == b.dcache.length and a.dcache.end_pos == b.dcache.end_pos
            m = a.dcache.length
            # NOTE: each load times whether the CPU drafter runs in bf16, so the two may differ in dtype
            tol = 1e-5 if a.dcache.k.dtype == b.dcache.k.dtype == torch.float32 else 5e-2
            assert torch.allclose(a.dcache.k[:, :m].float(), b.dcache.k[:, :m].float(), atol=tol)
    finally:
        for e in pair:
            drop_drafter(e)
    if noise == 0.0:
        assert got["mean_accepted_length"] > 4


def test_static_round_over_a_long_context(pair):
    eager, static = pair
    prompt = eager.tokenizer.encode(LONG)
    assert len(prompt) > 256
    want = run(eager, prompt, mode="ar", max_new_tokens=20)["token_ids"]
    assert run(static, prompt, mode="ddtree", budget=16, max_new_tokens=20)["token_ids"] == want
    assert static.decoder.graphs.draft_key("ddtree", 16)[3] == 512


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("mode,budget", [("ddtree", 16), ("dflash", 7)])
def test_a_verify_attends_the_span_of_the_cache_its_rows_need(synthetic_pair, monkeypatch, mode, budget, device):
    """A verify's attention is handed the target cache's first power-of-two span (from 256 slots) covering the
    rows it may read and write (a round launched ahead: those of the round in flight's path too), not the
    whole cache, so its plan follows the prefix; a reply that crosses 256 slots keeps `ar`'s tokens (on a GPU:
    the recorded programs of both spans)."""
    from ddtree_chat.engine import model

    eager = Engine.load(*synthetic_pair, device=device, graphs=False)
    static = Engine.load(*synthetic_pair, device=device)
    static.decoder.run_ahead = True
    sr, whole = static.decoder.graphs, static.decoder.max_len
    assert (sr.target_span(1), sr.target_span(257), sr.target_span(whole)) == (256, 512, 0)
    prompt = eager.tokenizer.encode(LONG)[:200]
    want = run(eager, prompt, mode="ar", max_new_tokens=120)["token_ids"]
    seen, attend = [], model.ops.mla_attention

    def spy(q_lat, q_pe, ckv, kpe, prefix, *rest):
        seen.append((ckv.shape[-2], q_lat.shape[-3], int(prefix) if device == "cpu" else None))  # no sync in a capture
        return attend(q_lat, q_pe, ckv, kpe, prefix, *rest)

    monkeypatch.setattr(model.ops, "mla_attention", spy)
    assert run(static, prompt, mode=mode, budget=budget, max_new_tokens=120)["token_ids"] == want
    if device == "cpu":  # NOTE: recorded programs run no Python: their forwards are seen only while recording
        spans = [x for x in seen if x[0] != whole]
        assert {s for s, _, _ in spans} == {256, 512}
        assert all(p + t <= s for s, t, p in spans), [x for x in spans if x[2] + x[1] > x[0]]
    else:
        assert {k.span for k in sr.graphs if k.program == "verify"} >= {256, 512}


def committed_state(dec):
    n, m = dec.cache.length, dec.dcache.length
    return (list(dec.tokens), n, m, dec.dcache.end_pos, dec.cache.ckv[:, :n].clone(), dec.cache.kpe[:, :n].clone(),
            dec.dcache.k[:, :m].float().clone(), dec.dcache.v[:, :m].float().clone())


def assert_same_state(a, b, atol):
    assert a[:4] == b[:4]
    for x, y in zip(a[4:], b[4:]):
        assert torch.allclose(x, y, atol=atol), (x - y).abs().max()


@pytest.mark.parametrize("drafting", [True, False])
def test_static_prefill_commits_what_the_eager_prefill_commits(pair, drafting):
    """A prompt through the recorded chunks (256 + 64 rows for 300 tokens; 16 for a short one; a second
    turn reusing the first's cache) leaves the caches of one eager forward and its last token's logits."""
    eager, static = pair
    from ddtree_chat.engine.graphs import PREFILL_SIZES

    assert PREFILL_SIZES == (16, 64, 256)
    runs = []
    sr = static.decoder.graphs
    run_key = sr.run
    sr.run = lambda key: runs.append(key) or run_key(key)
    try:
        # NOTE: a first token neither engine's committed tokens start with: nothing to reuse (earlier tests ran)
        first = min({1, 2, 3} - {e.decoder.tokens[0] for e in pair if e.decoder.tokens})
        long = [first] + (eager.tokenizer.encode(LONG) * 2)[:299]
        for ids, chunks in ((long, [256, 64]), (long[:9], [16]), (long[:9] + [5, 6, 7], [16])):
            runs.clear()
            outs = [(e.decoder.prefill(ids, drafting), committed_state(e.decoder)) for e in pair]
            assert [k[1] for k in runs] == chunks and all(k == ("prefill", k[1], drafting) for k in runs)
            assert torch.allclose(outs[0][0], outs[1][0], atol=1e-4)
            # NOTE: each load times whether the CPU drafter runs in bf16, so the two may differ in dtype
            bf16 = torch.bfloat16 in (eager.decoder.draft_dtype, static.decoder.draft_dtype)
            assert_same_state(outs[0][1], outs[1][1], 5e-2 if bf16 else 1e-4)
    finally:
        del sr.run


def test_static_prefill_near_the_context_end_runs_unpadded(synthetic_pair):
    """A prompt whose padded chunk would pass the context's last slot runs in chunks of its own length."""
    direct, static = (Engine.load(*synthetic_pair, device="cpu", max_context=40) for _ in range(2))
    dec = static.decoder
    prompt = list(range(1, 39))
    want = run(direct, prompt, mode="ar", max_new_tokens=4)["token_ids"]
    dec.graphs.pads_prefill = True
    assert dec.graphs.prefill_sizes(True) == [16]
    assert dec._chunks(20, True) == [(16, 16), (16, 4)]
    assert dec._chunks(38, True) == [(38, 38)]  # a third 16-row chunk from slot 32 would pass slot 40
    assert run(static, prompt, mode="ar", max_new_tokens=4)["token_ids"] == want


def test_static_round_stops_inside_a_path_and_at_the_limit(pair):
    eager, static = pair
    prompt = eager.tokenizer.encode("stop here")
    ar = run(eager, prompt, mode="ar", max_new_tokens=20)["token_ids"]
    stop = next(t for i, t in enumerate(ar) if i >= 3 and t not in ar[:i])
    with_drafter(static, TargetDrafter(static))
    try:
        got = run(static, prompt, mode="ddtree", budget=16, max_new_tokens=20, stop_token_ids=(stop,))
        assert got["token_ids"] == ar[: ar.index(stop) + 1] and got["stop_reason"] == "stop_token"
        assert static.decoder.tokens + [static.decoder.pending] == prompt + got["token_ids"]
        # the next turn starts from exactly what was emitted (the rows past it were scratch)
        nxt = prompt + got["token_ids"] + eager.tokenizer.encode(" more")
        assert run(static, nxt, mode="ddtree", budget=16, max_new_tokens=6)["token_ids"] == \
            run(eager, nxt, mode="ar", max_new_tokens=6)["token_ids"]
        limited = run(static, prompt, mode="ddtree", budget=16, max_new_tokens=5)
        assert limited["token_ids"] == ar[:5] and limited["stop_reason"] == "max_new_tokens"
    finally:
        drop_drafter(static)


def test_static_round_with_a_sliding_drafter_window(synthetic_pair):
    """A drafter window smaller than the context: the host slides it before each static round (making
    room for a whole block, so it may keep a few entries fewer than the eager round: speed only)."""
    eager = Engine.load(*synthetic_pair, device="cpu")
    static = Engine.load(*synthetic_pair, device="cpu")
    for e in (eager, static):
        dec = e.decoder
        dec.dcache.__init__(dec.dcfg.num_layers, dec.max_len, dec.dcfg.num_kv_heads, dec.dcfg.head_dim,
                            dec.draft_dtype, dec.device, window=24)
    static.use_graphs(capture=False)
    prompt = eager.tokenizer.encode("a window of twenty-four entries")
    want = run(eager, prompt, mode="ar", max_new_tokens=40)
    got = run(static, prompt, mode="ddtree", budget=16, max_new_tokens=40)
    assert got["token_ids"] == want["token_ids"]
    dc = static.decoder.dcache
    assert dc.capacity == 24 and 24 - static.dcfg.block_size <= dc.length <= 24
    assert dc.end_pos == static.decoder.cache.length


def test_sampling_through_the_static_round_is_seeded(pair):
    _, static = pair
    prompt = static.tokenizer.encode("sample")
    a = run(static, prompt, mode="ddtree", budget=16, max_new_tokens=15, temperature=0.8, seed=3)["token_ids"]
    b = run(static, prompt, mode="ddtree", budget=16, max_new_tokens=15, temperature=0.8, seed=3)["token_ids"]
    assert a == b and len(a) == 15


@pytest.mark.gpu
def test_cuda_graph_rounds_equal_ar(synthetic_pair):
    eager = Engine.load(*synthetic_pair, device="cuda", graphs=False)
    graphed = Engine.load(*synthetic_pair, device="cuda")
    assert graphed.info["cuda_graphs"] > 0
    for text in PROMPTS:
        prompt = eager.tokenizer.encode(text)
        want = run(eager, prompt, mode="ar", max_new_tokens=24)["token_ids"]
        assert run(graphed, prompt, mode="ar", max_new_tokens=24)["token_ids"] == want
        for budget in (7, 16, 64, "auto"):
            assert run(graphed, prompt, mode="ddtree", budget=budget, max_new_tokens=24)["token_ids"] == want
        assert run(graphed, prompt, mode="dflash", max_new_tokens=24)["token_ids"] == want


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_repeat_penalised_rounds_equal_the_penalised_ar(synthetic_pair, device):
    """The static rounds (recorded on CUDA) with a repeat penalty: every mode gives the eager ar reply's ids,
    which the penalty changed, with rounds launched ahead (their penalty reads the tokens committed on the device)
    and the penalty changed between replies; the penalty runs inside the verify and accept programs."""
    eager = Engine.load(*synthetic_pair, device=device, graphs=False)
    static = Engine.load(*synthetic_pair, device=device)
    if device == "cpu":
        static.use_graphs(capture=False)
        static.decoder.graphs.pads_prefill, static.decoder.run_ahead = True, True
    launch, ahead = static.decoder._launch, []
    static.decoder._launch = lambda *a, fresh, **kw: ahead.append(not fresh) or launch(*a, fresh=fresh, **kw)
    sr, rounds, penalised = static.decoder.graphs, static.decoder.round, []  # penalised programs after each round
    static.decoder.round = lambda *a, **kw: (rounds(*a, **kw), penalised.append(sum(map(_penalised, sr.graphs))))[0]
    changed = False
    for i, text in enumerate(PROMPTS):
        prompt, penalty = eager.tokenizer.encode(text), (1.5, 1.2)[i % 2]
        want = run(eager, prompt, mode="ar", max_new_tokens=32, repeat_penalty=penalty)["token_ids"]
        changed |= want != run(eager, prompt, mode="ar", max_new_tokens=32)["token_ids"]
        for kw in ({"mode": "ar"}, {"mode": "dflash"}, {"mode": "ddtree", "budget": 16},
                   {"mode": "ddtree", "budget": "auto"}):
            assert run(static, prompt, max_new_tokens=32, repeat_penalty=penalty, **kw)["token_ids"] == want, kw
    assert changed and sum(ahead) > 20
    # NOTE: recorded before the first penalised reply's prefill, all of them: none by a round
    assert len(set(penalised)) == 1 and (penalised[0] > 0) == (device == "cuda")
    if device == "cuda":  # and once: a later penalised reply does not name them again
        sr.prepare = lambda keys: pytest.fail("the penalised programs were named again")
        assert static.decoder.record_variant(Variant(penalty=True)) == 0.0
        del sr.prepare
    assert {k.program for k in (sr.graphs if device == "cuda" else sr.outputs) if _penalised(k)} == {"verify", "accept"}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_sampled_static_rounds_emit_the_eager_ar_tokens(synthetic_pair, device):
    """T > 0 through the static rounds (recorded on CUDA, run ahead): every mode emits the tokens the eager ar
    reply samples for the seed (each draw keyed by its token's position, read from the device), a penalty too."""
    eager = Engine.load(*synthetic_pair, device=device, graphs=False)
    static = Engine.load(*synthetic_pair, device=device)
    if device == "cpu":
        static.use_graphs(capture=False)
        static.decoder.graphs.pads_prefill, static.decoder.run_ahead = True, True
    sr, rounds, grew = static.decoder.graphs, static.decoder.round, []  # whether each round recorded a program
    static.decoder.round = lambda *a, **kw: (n := len(sr.graphs), rounds(*a, **kw), grew.append(len(sr.graphs) > n))[1]
    for text in PROMPTS:
        prompt = eager.tokenizer.encode(text)
        for kw in ({"temperature": 0.8, "seed": 3}, {"temperature": 0.6, "top_p": 0.9, "seed": 4, "repeat_penalty": 1.3},
                   {"temperature": 0.7, "top_p": 0.8, "seed": 5}):
            want = run(eager, prompt, mode="ar", max_new_tokens=32, **kw)["token_ids"]
            for mode, budget in (("ar", 0), ("dflash", 0), ("ddtree", 16), ("ddtree", "auto")):
                assert run(static, prompt, mode=mode, budget=budget, max_new_tokens=32, **kw)["token_ids"] == want, \
                    (text, kw, mode, budget)
    # NOTE: the draw runs inside the verify programs, recorded before each variant's first reply: none by a round
    assert {"all", "top_p"} <= {k.sampled for k in (sr.graphs if device == "cuda" else sr.outputs) if k.program == "verify"}
    if device == "cuda":  # NOTE: the CPU records nothing
        assert grew and not any(grew)


def _penalised(key) -> bool:
    return getattr(key, "penalty", False)


@pytest.mark.gpu
def test_cuda_graph_auto_plain_steps_and_trees_in_turn_equal_ar(synthetic_pair, monkeypatch):
    """Recorded: plain steps launched ahead (the first by the tree round that chose them) keeping their
    features, the drafter's catch-up from those (no prefill chunk but the prompt's), trees after it; greedy and
    sampled replies run."""
    eager = Engine.load(*synthetic_pair, device="cuda", graphs=False)
    graphed = Engine.load(*synthetic_pair, device="cuda")
    flips = iter(range(10**6))
    monkeypatch.setattr(AutoBudget, "plain_rate", lambda self: math.inf if next(flips) % 2 == 0 else 0.0)
    dec, chunks = graphed.decoder, []
    prefill_chunks = dec._prefill_chunks
    monkeypatch.setattr(dec, "_prefill_chunks", lambda *a: chunks.append(len(a[0])) or prefill_chunks(*a))
    for text in PROMPTS + [LONG]:
        prompt = eager.tokenizer.encode(text)
        want = run(eager, prompt, mode="ar", max_new_tokens=64)["token_ids"]
        chunks.clear()
        evs = list(graphed.generate(prompt, GenerationConfig(mode="ddtree", budget="auto", max_new_tokens=64,
                                                             stop_token_ids=())))
        assert evs[-1]["token_ids"] == want
        assert {ev["mode"] for ev in evs[1:-1]} == {"ar", "ddtree"}
        assert len(chunks) == 1  # the prompt's: every catch-up came from the kept features
        sampled = run(graphed, prompt, mode="ddtree", budget="auto", max_new_tokens=32, temperature=0.8, seed=1)
        assert len(sampled["token_ids"]) == 32


def test_what_a_warm_up_run_writes_is_put_back(pair):
    """The recording's warm-up run (here each program run eagerly on CPU, as capture=False does) writes
    only what _save_for_warm_up keeps: afterwards every buffer and cache row is as before."""
    _, static = pair
    dec, sr = static.decoder, static.decoder.graphs
    dec.prefill(static.tokenizer.encode(LONG)[:40], drafting=True)
    sr.begin(*dec.committed_state(7))
    dec.recent.ring.fill_(1)  # NOTE: unlike the tokens a penalised accept commits (the restored tree's zeros)
    bufs = lambda: [t.clone() for t in (*sr._written, sr.prompt, sr.last, dec.cache.ckv, dec.cache.kpe, dec.dcache.k,
                                        dec.dcache.v, dec.recent.ring)]  # noqa: E731
    for key in (sr.draft_key("ddtree", 11), ("verify", 12, True), ("accept", 12, True, False), ("prefill", 16, True),
                ("verify", 1, False), ("accept", 1, False, True), ("verify", 12, True, True),
                ("accept", 12, True, False, False, True)):  # NOTE: the last two: the repeat penalty's window too
        before = bufs()
        saved = sr._save_for_warm_up(0 if key[0] == "draft" else key[1])
        sr.outputs[graph_key(key)] = sr._program(key)()
        sr._restore(saved)
        assert all(torch.equal(a, b) for a, b in zip(before, bufs())), key


def test_warm_hands_every_rounds_programs_to_the_recording(pair, monkeypatch):
    """warm records each round's draft / verify / accept programs, not only the prefill chunks (its key
    groups are read twice: by the precompile, then by the recording)."""
    sr = pair[1].decoder.graphs
    handed = []
    monkeypatch.setattr(sr, "prepare", lambda keys: handed.extend(keys))
    sr.warm([(Mode.AR, 0, False), (Mode.DDTREE, 16, False)])
    programs = [k[0] for k in handed]
    assert programs.count("draft") == 1 and programs.count("verify") == 2 and programs.count("accept") == 2
    assert "prefill" in programs


@pytest.mark.gpu
def test_a_recording_leaves_the_device_state_as_it_was(synthetic_pair):
    """Recording a program runs it once; the state, tree buffers and cache rows that run wrote come back."""
    graphed = Engine.load(*synthetic_pair, device="cuda")
    dec, sr = graphed.decoder, graphed.decoder.graphs
    dec.prefill(graphed.tokenizer.encode(LONG)[:40], drafting=True)
    sr.begin(*dec.committed_state(7))
    before = [t.clone() for t in (sr._state_block, sr.tokens, sr.choice, dec.cache.ckv, dec.cache.kpe, dec.dcache.k)]
    sr.graphs.pop(("prefill", 16, True))
    for key in (("verify", 12, True), ("accept", 12, True, False), sr.draft_key("ddtree", 11), ("prefill", 16, True)):
        assert key not in sr.graphs
        sr.prepare([key])
    after = (sr._state_block, sr.tokens, sr.choice, dec.cache.ckv, dec.cache.kpe, dec.dcache.k)
    assert all(torch.equal(a, b) for a, b in zip(before, after))


@pytest.mark.gpu
def test_the_prompts_logits_survive_other_programs(synthetic_pair):
    """The graphs share one memory pool: a verify replayed after the prefill (the auto budget times them
    before the first token is read) overwrote the prefill graph's output, and a fresh engine's first
    `--budget auto` reply began with a wrong token. Fresh engine and home, so no test order hides it."""
    code = f"""
import os, sys, tempfile, torch
os.environ["DDTREE_CHAT_HOME"] = tempfile.mkdtemp()
from ddtree_chat.engine import Engine, GenerationConfig
from ddtree_chat.engine.generation import AUTO_BUDGETS
eng = Engine.load({str(synthetic_pair[0])!r}, {str(synthetic_pair[1])!r}, device="cuda")
dec, sr = eng.decoder, eng.decoder.graphs
ids = eng.tokenizer.encode("def f(x):")
want = dec.prefill(ids, drafting=True).clone()
got = dec.prefill(ids, drafting=True)
for c in AUTO_BUDGETS:
    sr.verify_seconds(c + 1, torch.arange(c + 1, device="cuda"), repeats=1)
assert torch.equal(got, want), "prefill logits overwritten"
ar = list(eng.generate(ids, GenerationConfig(mode="ar", max_new_tokens=12, stop_token_ids=())))[-1]["token_ids"]
auto = list(eng.generate(ids, GenerationConfig(mode="ddtree", budget="auto", max_new_tokens=12, stop_token_ids=())))
assert auto[-1]["token_ids"] == ar, (auto[-1]["token_ids"], ar)
print("ok")
"""
    import subprocess
    import sys

    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "DDTREE_CHAT_HOME"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


@pytest.mark.gpu
def test_a_cold_first_start_compiles_its_kernels_before_recording(synthetic_pair, tmp_path):
    """An empty Triton cache (a first start): the programs' kernels are found and compiled side by side
    before the recording (ops/precompile.py), so the recording compiles none itself, and the replies are
    still plain decoding's. Fresh process, home and Triton cache."""
    code = f"""
import logging, os, re, sys, tempfile
os.environ["DDTREE_CHAT_HOME"] = tempfile.mkdtemp()
from triton import knobs
compiled = []
knobs.runtime.jit_post_compile_hook = lambda **kw: compiled.append(kw["fn"].name) or None
from ddtree_chat.engine import Engine, GenerationConfig
from ddtree_chat.engine.ops import precompile
counts, stages = [], []
real = precompile.Pool.wait
def counted(pool):
    counts.append((pool.submitted, real(pool), len(compiled)))  # after each discovery pass: found, compiled
    return counts[-1][1]
precompile.Pool.wait = counted
eng = Engine.load({str(synthetic_pair[0])!r}, {str(synthetic_pair[1])!r}, device="cuda",
                  progress=lambda done, total, what: stages.append(what))
found, done, at = counts[-1]
assert found >= 10 and done == found, counts
assert not compiled[at:], f"compiled while recording: {{compiled[at:]}}"
recorded = {{k[0] for k in eng.decoder.graphs.graphs}}
assert {{"prefill", "draft", "verify", "accept"}} <= recorded, recorded  # the rounds too, at load
assert stages.count("compiling GPU kernels") == found and stages[-1] == "recording CUDA graphs", stages
print("passes", counts)
ids = eng.tokenizer.encode("def f(x):")
ar = list(eng.generate(ids, GenerationConfig(mode="ar", max_new_tokens=24, stop_token_ids=())))[-1]["token_ids"]
for mode, budget in (("ddtree", 16), ("ddtree", "auto"), ("dflash", 7)):
    got = list(eng.generate(ids, GenerationConfig(mode=mode, budget=budget, max_new_tokens=24, stop_token_ids=())))
    assert got[-1]["token_ids"] == ar, (mode, budget)
print("ok")
"""
    import subprocess
    import sys

    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "DDTREE_CHAT_HOME"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]


@pytest.mark.gpu
def test_cuda_graph_prefill_equals_the_eager_prefill(synthetic_pair):
    """The prefill chunks are recorded at load and replayed: the eager forward's caches and logits."""
    eager = Engine.load(*synthetic_pair, device="cuda", graphs=False)
    graphed = Engine.load(*synthetic_pair, device="cuda")
    recorded = graphed.decoder.graphs.graphs
    assert all(("prefill", n, d) in recorded for n in (16, 64, 256) for d in (True, False))
    long = (eager.tokenizer.encode(LONG) * 2)[:300]
    for ids in (long, long[:9], long[:9] + [5, 6, 7]):
        for drafting in (True, False):
            outs = [(e.decoder.prefill(ids, drafting), committed_state(e.decoder)) for e in (eager, graphed)]
            assert torch.allclose(outs[0][0], outs[1][0], atol=1e-4)
            assert_same_state(outs[0][1], outs[1][1], 1e-4)


@pytest.mark.gpu
def test_a_program_recorded_mid_chat_writes_past_the_committed_rows(synthetic_pair):
    """A budget first used mid-chat records its verify and accept then, which runs each once (the warm-up
    before the capture): whatever the device state says (here forced to 0, the prompt's first row), the
    recording puts back what that run wrote."""
    eager = Engine.load(*synthetic_pair, device="cuda", graphs=False)
    graphed = Engine.load(*synthetic_pair, device="cuda")
    dec, sr = graphed.decoder, graphed.decoder.graphs
    prompt = eager.tokenizer.encode(PROMPTS[1])
    want = run(eager, prompt, mode="ar", max_new_tokens=24)["token_ids"]
    prefill = dec.prefill
    dec.prefill = lambda *a, **k: (prefill(*a, **k), sr.state.zero_())[0]
    try:
        key = sr.accept_key(Mode.DDTREE, 13)
        assert key[:4] == ("accept", 13, True, False) and key not in sr.graphs
        assert run(graphed, prompt, mode="ddtree", budget=12, max_new_tokens=24)["token_ids"] == want
        assert key in sr.graphs
    finally:
        del dec.prefill


@pytest.mark.gpu
def test_round_programs_never_synchronise_with_the_host(synthetic_pair):
    """The issue's rule (no host sync inside a round) checked directly: CUDA's sync debug mode turns
    every synchronising call (item(), tolist(), a pageable copy) into an error."""
    eng = Engine.load(*synthetic_pair, device="cuda", graphs=False)
    eng.use_graphs(capture=False)
    prompt = eng.tokenizer.encode("warm up")
    run(eng, prompt, mode="ddtree", budget=16, max_new_tokens=8)  # autotuning and lazy builds happen here
    sr, dec = eng.decoder.graphs, eng.decoder
    sr.begin(dec.cache.length, dec.dcache.length, dec.pending)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        dec.recent.write(dec.tokens)  # a fresh penalised round's window, from the host's tokens
        sr.use(penalty=1.3, temperature=0.8, top_p=0.95, seed=7)
        penalised, nucleus, drawn = Variant(penalty=True), Variant(sampled="top_p"), Variant(True, "all")
        for key in (sr.draft_key("ddtree", 16, True), sr.verify_key("ddtree", 17), sr.accept_key("ddtree", 17),
                    sr.draft_key("dflash", 7), sr.verify_key("dflash", 8), sr.accept_key("dflash", 8),
                    sr.verify_key("ddtree", 1), sr.accept_key("ddtree", 1), sr.verify_key("ar", 1),
                    sr.accept_key("ar", 1), sr.draft_key("ddtree", 16), sr.verify_key("ddtree", 17, variant=penalised),
                    sr.accept_key("ddtree", 17, variant=penalised), sr.verify_key("ar", 1, variant=penalised),
                    sr.accept_key("ar", 1, variant=penalised), sr.draft_key("ddtree", 16),
                    sr.verify_key("ddtree", 17, variant=nucleus), sr.accept_key("ddtree", 17, variant=nucleus),
                    sr.verify_key("ar", 1, variant=drawn), sr.accept_key("ar", 1, variant=drawn)):
            sr.run(key)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("device, vocab", [("cpu", 8192), pytest.param("cuda", 163840, marks=pytest.mark.gpu)])
def test_a_rows_sample_is_the_same_alone_and_in_any_launch(device, vocab):
    """Softmax, the top-p filter (a sort, or the CPU's top-k shortcut whose k follows the launch's rows), the
    race: a row's nucleus, bit for bit by token, and its sample do not depend on the rows that share its launch;
    bf16-valued logits (the demo's and K2.6's vocabularies), so ties are many."""
    from ddtree_chat.engine.sampling import nucleus

    g = torch.Generator(device=device).manual_seed(0)
    logits = (torch.randn(65, vocab, device=device, generator=g) * 3).bfloat16().float()
    seed, pos = torch.tensor(5, device=device), torch.arange(100, 165, device=device)
    probs = torch.softmax(logits / 0.8, -1)
    for top_p in (1.0, 0.95, 0.5):
        full = target_choice(logits, 0.8, top_p, seed, pos)
        kept, ids = nucleus(probs, top_p)
        by_token = torch.zeros_like(probs).scatter_(-1, ids, kept)
        for n in (1, 8, 17):
            for i0 in (0, 65 - n):
                rows = slice(i0, i0 + n)
                assert torch.equal(target_choice(logits[rows], 0.8, top_p, seed, pos[rows]), full[rows]), (top_p, n)
                k, i = nucleus(probs[rows], top_p)
                assert torch.equal(torch.zeros_like(probs[rows]).scatter_(-1, i, k), by_token[rows]), (top_p, n)


@pytest.mark.gpu
def test_bf16_rounds_record_with_the_fast_kernels():
    """bf16 (the real-checkpoint path: INT4 MoE CUDA kernel, Triton MLA; the demo's shapes fit both)
    records and replays too."""
    from ddtree_chat.engine.default_model import shipped_demo_dirs

    if shipped_demo_dirs() is None:
        pytest.skip("demo assets absent")
    eng = Engine.load(*shipped_demo_dirs(), device="cuda", dtype="bfloat16")
    assert eng.info["cuda_graphs"] > 0
    prompt = eng.tokenizer.encode(PROMPTS[0])
    for mode, budget in (("ar", 0), ("ddtree", 16), ("ddtree", "auto")):
        done = run(eng, prompt, mode=mode, budget=budget, max_new_tokens=24)
        assert len(done["token_ids"]) == 24 and done["stop_reason"] == "max_new_tokens"


def test_a_failed_recording_falls_back_to_direct_runs(synthetic_pair):
    """A size or span that cannot be recorded mid-reply (an op that cannot be captured, OOM) turns recording
    off with one warning; the reply goes on, its programs run directly, with the same tokens. (On the CPU
    the executor only pretends to record: prepare is replaced.)"""
    eng = Engine.load(*synthetic_pair, device="cpu")
    prompt = eng.tokenizer.encode(PROMPTS[0])
    want = run(eng, prompt, mode="ar", max_new_tokens=30)["token_ids"]
    for failing, error in ((3, RuntimeError("operation not permitted when stream is capturing")),
                           (1, torch.OutOfMemoryError("no room"))):
        sr, calls = eng.decoder.graphs, []

        def prepare(keys):
            calls.append(keys)
            if len(calls) == failing:  # 3: the third launch of the reply, one launched ahead; 1: the first
                raise error

        sr.capture, sr.prepare = True, prepare
        assert run(eng, prompt, mode="ddtree", budget=16, max_new_tokens=30)["token_ids"] == want
        assert not sr.capture and len(calls) == failing
        del sr.prepare


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("mode,budget", [("ddtree", 16), ("ddtree", "auto"), ("dflash", 7)])
def test_static_rounds_fill_the_context_to_its_last_slot(synthetic_pair, mode, budget, device):
    """Rounds launched ahead, then plain steps once a tree or block no longer fits: the reply ends with
    the context full, with `ar`'s tokens (on a GPU: recorded CUDA graphs)."""
    static = Engine.load(*synthetic_pair, device=device, max_context=48)
    if device == "cpu":
        static.decoder.run_ahead = True
    sr = static.decoder.graphs
    assert sr.fits("ddtree", 32) and not sr.fits("ddtree", 64)  # no recording of a tree past the context
    prompt = list(range(20))
    want = run(static, prompt, mode="ar", max_new_tokens=100)
    got = run(static, prompt, mode=mode, budget=budget, max_new_tokens=100)
    assert got["stop_reason"] == want["stop_reason"] == "context"
    assert len(got["token_ids"]) == 48 - len(prompt) + 1
    assert got["token_ids"] == want["token_ids"]
