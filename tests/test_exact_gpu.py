"""Row invariance on the GPU at Kimi K2.6's real layer dimensions (bf16, kernels on): a row computed alone
(the AR step) equals, bit for bit, the same row inside 8/17/65/257-row launches (a dflash block, trees, a
prefill chunk), op by op and through the whole target; so speculative decoding gives plain decoding's
tokens exactly (docs/exactness.md)."""

import pytest
import torch

from ddtree_chat.engine import ops
from ddtree_chat.engine.ops.mla_attention import mla_attention_ref
from ddtree_chat.engine.ops.registry import prefer_library, strict

from drafters import closure_mask
from int4_experts import random_experts

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ROWS = (8, 17, 65, 257)
BF16 = torch.bfloat16
H = 7168
SCALE = 0.1352  # K2.6's softmax scale (192-wide heads, YaRN mscale) to four digits


@pytest.fixture(autouse=True)
def no_silent_fallback():
    """A kernel that fails, or declines a call its supports accepted, raises (registry strict mode)."""
    with strict():
        yield


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def assert_row_invariant(fn, width: int, dtype=BF16, seed: int = 0):
    """fn(x [M, width]) -> [M, ...]: row `r` of x alone, then placed first, last and in the middle of M-row
    launches among random rows, gives the same output row."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = torch.randn(1, width, device="cuda", generator=g).to(dtype)
    want = fn(r)[0]
    for m in ROWS:
        x = torch.randn(m, width, device="cuda", generator=g).to(dtype)
        for at in sorted({0, m // 2, m - 1}):
            x2 = x.clone()
            x2[at] = r[0]
            got = fn(x2)[at]
            assert torch.equal(got, want), f"row {at} of {m}: max diff {(got.float() - want.float()).abs().max():.3g}"


def weight(n, k, seed, dtype=BF16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).to(dtype)


# K2.6's dense products: q_a + kv_a (fused), q_b, o_proj, the shared expert, the dense MLP, the lm head
PRODUCTS = [(1536 + 576, H), (64 * 192, 1536), (H, 64 * 128), (2048, H), (H, 2048), (18432, H), (H, 18432),
            (163840, H)]
# the same at a TP=8 rank (8 heads, an eighth of each MLP and of the vocabulary): their own TILES entries
RANK_PRODUCTS = [(1536, 1536), (H, 1024), (256, H), (H, 256), (2304, H), (H, 2304), (20480, H)]


@pytest.mark.parametrize("n,k", PRODUCTS + RANK_PRODUCTS)
def test_dense_products_are_row_invariant(n, k):
    w = weight(n, k, n + k)
    assert_row_invariant(lambda x: ops.linear(x, w), k)
    with prefer_library():  # directly run forwards (prefills) take the same kernel
        assert_row_invariant(lambda x: ops.linear(x, w), k, seed=1)
    x = torch.randn(33, k, device="cuda").to(BF16)
    assert rel(ops.linear(x, w), x.double() @ w.double().T) < 1e-2


@pytest.mark.parametrize("n,k", [(1536 + 576, H), (H, 2048)])
def test_every_candidate_product_tile_is_row_invariant(n, k, monkeypatch):
    """Every tile the exact sweep may put in triton_exact_linear.TILES (16-, 32-, 64-row blocks: wgmma on
    Hopper), at a split-K shape and a wide one: a table switch after the sweep keeps the property."""
    from exact_tiles import candidates

    from ddtree_chat.engine.ops import triton_exact_linear as el

    w = weight(n, k, n + k)
    for tile in candidates():
        monkeypatch.setitem(el.TILES, (n, k), tuple(tile))
        assert_row_invariant(lambda x: el.matmul_nt_exact(x, w), k)
        x = torch.randn(65, k, device="cuda").to(BF16)
        assert rel(el.matmul_nt_exact(x, w), x.double() @ w.double().T) < 1e-2, tile


def test_residual_glu_and_router_products_are_row_invariant():
    wg, wu, wd = weight(2048, H, 1), weight(2048, H, 2), weight(H, 2048, 3)
    res = torch.randn(300, H, device="cuda").to(BF16)
    assert_row_invariant(lambda x: ops.linear_glu(x, wg, wu), H)
    # the residual rides with its row: built from the row's own values
    assert_row_invariant(lambda x: ops.linear_add(x, wd, x.repeat(1, 4)[:, :H].contiguous()), 2048)
    x = torch.randn(40, 2048, device="cuda").to(BF16)
    want = res[:40].double() + x.double() @ wd.double().T
    assert rel(ops.linear_add(x, wd, res[:40]), want) < 1e-2
    # the router's float32 logits from a bf16 gate (its half-precision form) and a float32 one (the FFMA form)
    for gate in (weight(64, H, 64), weight(384, H, 384), weight(384, H, 385).float()):
        assert_row_invariant(lambda x: ops.router_logits(x, gate), H)
        x = torch.randn(9, H, device="cuda").to(BF16)
        logits = ops.router_logits(x, gate)
        assert logits.dtype == torch.float32 and (logits - x.double() @ gate.double().T).abs().max() < 1e-4


@pytest.mark.parametrize("heads", [8, 64])
def test_mla_absorption_products_are_row_invariant(heads):
    """[T, h, 128] x [h, 512, 128] and back, through the head-transposed views the model passes."""
    w = weight(heads * 256, 512, heads).view(heads, 256, 512)
    w_uk, w_uv = w[:, :128], w[:, 128:]

    def absorb(q):  # q [M, h*128] -> [M, h*512]
        q3 = q.view(-1, heads, 128)
        return ops.matmul_nt(q3.transpose(0, 1), w_uk.transpose(-1, -2)).transpose(0, 1).reshape(q.shape[0], -1)

    def back(o):  # o [M, h*512] -> [M, h*128]
        o3 = o.view(-1, heads, 512)
        return ops.matmul_nt(o3.transpose(0, 1), w_uv).transpose(0, 1).reshape(o.shape[0], -1)

    assert_row_invariant(absorb, heads * 128)
    assert_row_invariant(back, heads * 512)


@pytest.fixture(scope="module")
def k26():
    """K2.6 at its real layer dimensions, 2 layers (dense, then MoE with 64 of the 384 experts), bf16."""
    from ddtree_chat.engine.random_model import k26_config, random_target

    cfg = k26_config(layers=2, n_routed_experts=64)
    model = random_target(cfg, "cuda", BF16)
    model.fuse_projections()
    model.reserve_rope(4096 + 1100, BF16)
    return cfg, model


def test_moe_layer_is_row_invariant(k26):
    """Router, INT4 experts (the variant picked for every token count), shared expert, residual."""
    cfg, model = k26
    moe = model.layers[1].mlp
    assert_row_invariant(lambda x: moe(x[:, None, :], residual=x[:, None, :] * 0.5)[:, 0], H)
    assert_row_invariant(lambda x: moe(x), H, seed=2)


@pytest.mark.parametrize("inter", [256, 512])
def test_moe_experts_at_a_rank_slice_are_row_invariant(inter):
    """The INT4 experts with a TP rank's slice of K2.6's intermediate (TP=8: 256, TP=4: 512; the down product's
    short K takes its own tile, the same at every token count): each token's experts come from its own row."""
    from ddtree_chat.engine.ops.cuda_moe import moe_forward, pack_experts

    e, k = 64, 8
    pe = pack_experts(random_experts(e, H, inter, "cuda", seed=inter))

    def experts(x):
        scores = x[:, :e].float()  # a token's own pick: its first e features as router scores
        ids = scores.topk(k, dim=-1).indices
        return moe_forward(x, ids, torch.softmax(scores.gather(1, ids), -1), pe)

    assert_row_invariant(experts, H, seed=inter)


def _tree(t: int, chain: int, g: torch.Generator) -> tuple[list[int], int]:
    """Parents of a random t-node tree (parents first) holding a chain 0 -> ... of `chain` nodes; the
    chain's last node."""
    parents = [-1] + list(range(chain - 1))
    for i in range(chain, t):
        parents.append(int(torch.randint(0, i, (1,), generator=g)))
    return parents, chain - 1


def _cuda_engine(wide: bool):
    """The CUDA MLA kernel with its engine forced (cuda: 16-row CTAs; cuda-wide: 64-row ones, csrc/mla_wide.cu),
    whatever the GPU's default; skips where a wide CTA does not fit the GPU."""
    from ddtree_chat.engine.ops import cuda_mla as k

    if wide and not k.wide_fits(torch.device("cuda")):
        pytest.skip("a wide CTA's shared memory does not fit this GPU")

    def attend(*args, **kw):
        saved, k.FORCE = k.FORCE, {**k.FORCE, "wide": int(wide)}
        try:
            return k.mla_attention_cuda(*args, **kw)
        finally:
            k.FORCE = saved
    return attend


def _mla_kernel(kernel: str, heads: int):
    """(the row-invariant MLA kernel `kernel` called directly, the contexts it must be tested at: just before,
    on and after its chunk boundaries, and for the CUDA kernel its super-chunk boundaries)."""
    if kernel.startswith("cuda"):
        from ddtree_chat.engine.ops import cuda_mla as k

        c, s = k.CHUNK, k.CHUNK * k.SUPER
        return _cuda_engine(kernel == "cuda-wide"), (0, c - 3, c, s - 9, s + c - 1, 2 * s + 2 * c + 1)
    from ddtree_chat.engine.ops import triton_mla_exact as k

    c = k.chunk_keys(heads)
    return k.mla_attention_exact, (0, c - 3, c, 2 * c - 9, 3 * c - 1)


@pytest.mark.parametrize("kernel", ["cuda", "cuda-wide", "triton"])
@pytest.mark.parametrize("heads", [8, 64])
@pytest.mark.parametrize("t", [1, 8, 17, 65, 256])
def test_mla_attention_rows_match_the_ar_step(heads, t, kernel):
    """The deepest chain node of a t-node verify at prefix L attends exactly as the AR step at its
    position: contexts that end just before, on and after chunk boundaries; against the reference too."""
    dev = torch.device("cuda")
    attend, lengths = _mla_kernel(kernel, heads)
    g = torch.Generator().manual_seed(t * 7 + heads)
    n_keys = max(lengths) + t + 8
    keys = torch.randn(n_keys, 576, generator=g).to(dev, BF16)
    qs = (torch.randn(n_keys, heads, 576, generator=g) * 0.5).to(dev, BF16)
    for length in lengths:
        chain = min(t, 9) if t < 256 else t  # a prefill chunk: all t rows in one causal chain
        parents, deep = _tree(t, chain, g)
        mask = closure_mask(parents).to(dev)
        depth = int(mask[deep].sum()) - 1
        cap = length + t + 40
        ckv = torch.full((cap, 576), float("nan"), device=dev, dtype=BF16)  # NaN-poisoned unused slots
        ckv[:length] = keys[:length]
        ckv[length:length + t] = torch.randn(t, 576, generator=g).to(dev, BF16)
        q = (torch.randn(t, heads, 576, generator=g) * 0.5).to(dev, BF16)
        node = deep
        for d in range(depth, -1, -1):  # the chain holds the true keys at their positions
            ckv[length + node] = keys[length + d]
            node = parents[node]
        q[deep] = qs[length + depth]
        plen = torch.tensor([length], device=dev)
        out = attend(q[..., :512], q[..., 512:], ckv[:, :512], ckv[:, 512:], plen, mask, SCALE)
        ref = mla_attention_ref(q[..., :512], q[..., 512:], ckv[:, :512], ckv[:, 512:], length, mask, SCALE)
        assert rel(out, ref) < 1e-2
        p = length + depth  # the AR step: prefix p, its own key at slot p
        ar_cache = torch.full((p + 50, 576), float("nan"), device=dev, dtype=BF16)
        ar_cache[:p + 1] = keys[:p + 1]
        qa = qs[p:p + 1]
        one = torch.ones(1, 1, dtype=torch.bool, device=dev)
        ar = attend(qa[..., :512], qa[..., 512:], ar_cache[:, :512], ar_cache[:, 512:], p, one, SCALE)
        assert torch.equal(ar[0], out[deep]), f"prefix {length}, depth {depth}"


@pytest.mark.parametrize("heads", [8, 64])
def test_cuda_mla_plans_give_every_row_the_same_bits(heads, monkeypatch):
    """Every launch plan of each CUDA engine (both: a CTA per super, per chunk, or per 2 or 4 chunks each stored
    alone; narrow: value columns split 1/2/4 ways, one or two row groups a CTA, 2 or 4 stages; both: the nodes in one
    launch or several): every row of 1-, 17- and 65-node chains the same bits within the engine, contexts around
    chunk and super boundaries."""
    from ddtree_chat.engine.ops import cuda_mla

    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(heads)
    narrow = [{"F": f, "cs": cs, "stages": st, "rg": 1} for f in (1, 8) for cs in (1, 2, 4) for st in (2, 4)]
    narrow += [{"F": f, "stages": st, "rg": 2} for f in (1, 8) for st in (2, 4)] + [{"scratch": 1}]
    narrow += [{"F": 1, "FC": 2, "cs": 2, "stages": 2, "rg": 1}, {"F": 1, "FC": 4, "stages": 4, "rg": 2}]
    engines = [[{**p, "wide": 0} for p in narrow]]
    if cuda_mla.wide_fits(dev):
        engines.append([{"wide": 1, "F": 1, "FC": 1}, {"wide": 1, "F": 8}, {"wide": 1, "scratch": 1},
                        {"wide": 1, "F": 1, "FC": 2}, {"wide": 1, "F": 1, "FC": 4}])
    for t in (1, 17, 65):
        for length in (5, 2048 - 3, 2 * 2048 + 300):
            ckv = torch.randn(length + t + 8, 576, generator=g).to(dev, BF16)
            q = (torch.randn(t, heads, 576, generator=g) * 0.5).to(dev, BF16)
            mask = torch.ones(t, t, device=dev).tril().bool()
            plen = torch.tensor([length], device=dev)
            for plans in engines:
                outs = []
                for force in plans:
                    monkeypatch.setattr(cuda_mla, "FORCE", {k: v for k, v in force.items() if k != "scratch"})
                    monkeypatch.setattr(cuda_mla, "SCRATCH_BYTES", 1 if "scratch" in force else 256 << 20)
                    outs.append(cuda_mla.mla_attention_cuda(q[..., :512], q[..., 512:], ckv[:, :512], ckv[:, 512:],
                                                            plen, mask, SCALE))
                for force, out in zip(plans[1:], outs[1:]):
                    assert torch.equal(outs[0], out), f"{t} nodes at prefix {length}, plan {force}"


@pytest.mark.parametrize("heads", [8, 64])
def test_mla_sub_chunk_fold_gives_every_row_the_same_bits(heads, monkeypatch):
    """One program per chunk or one per sub-chunk (triton_mla_exact.FOLD forced both ways): every row of
    1-, 17- and 65-node chains (a tree's worth of rows) the same bits, contexts around chunk boundaries."""
    from ddtree_chat.engine.ops import triton_mla_exact as ex

    dev = torch.device("cuda")
    chunk = ex.chunk_keys(heads)
    g = torch.Generator().manual_seed(heads)
    for t in (1, 17, 65):
        for length in (5, chunk - 3, 2 * chunk + 130):
            ckv = torch.randn(length + t + 8, 576, generator=g).to(dev, BF16)
            q = (torch.randn(t, heads, 576, generator=g) * 0.5).to(dev, BF16)
            mask = torch.ones(t, t, device=dev).tril().bool()
            outs = []
            for fold in (False, True):
                monkeypatch.setattr(ex, "FOLD", fold)
                outs.append(ex.mla_attention_exact(q[..., :512], q[..., 512:], ckv[:, :512], ckv[:, 512:],
                                                   torch.tensor([length], device=dev), mask, SCALE))
            assert torch.equal(outs[0], outs[1]), f"{t} nodes at prefix {length}"


@pytest.mark.parametrize("kernel", ["cuda", "cuda-wide", "triton"])
@pytest.mark.parametrize("heads, lengths", [(8, (32768, 40000)), (64, (8192, 9000))])
def test_mla_rows_of_long_contexts_match_their_ar_steps(heads, lengths, kernel):
    """Contexts where the Triton kernel's one-token launch folds sub-chunk states in the merge (F > 1) and a 17-node
    one folds them in its programs (F = 1), so each launch builds its own merge; the CUDA kernel's AR steps at 8
    heads take one row group with the value columns split, its trees two row groups: every row of the chain equals
    its AR step (a TP=8 rank's 8 heads at 32k keys rounded rows apart while the Triton merge's builds contracted
    FMAs their own way)."""
    from ddtree_chat.engine.ops import triton_mla_exact as ex

    dev = torch.device("cuda")
    attend = _mla_kernel(kernel, heads)[0]
    g = torch.Generator().manual_seed(heads + 5)
    t = 17
    one = torch.ones(1, 1, dtype=torch.bool, device=dev)
    for length in lengths:
        if kernel == "triton":
            assert ex.layout(1, heads, length, dev)[2] > 1 and ex.layout(t, heads, length, dev)[2] == 1
        keys = torch.randn(length + t, 576, generator=g).to(dev, BF16)
        q = (torch.randn(t, heads, 576, generator=g) * 0.5).to(dev, BF16)
        mask = torch.ones(t, t, device=dev).tril().bool()
        args = (keys[:, :512], keys[:, 512:], torch.tensor([length], device=dev), mask, SCALE)
        out = attend(q[..., :512], q[..., 512:], *args)
        for i in range(t):
            ar = attend(q[i:i + 1, :, :512], q[i:i + 1, :, 512:], keys[:length + i + 1, :512],
                        keys[:length + i + 1, 512:], length + i, one, SCALE)
            assert torch.equal(ar[0], out[i]), f"row {i} at prefix {length}"


@pytest.mark.parametrize("heads", [8, 64])
def test_mla_planned_for_the_whole_cache_gives_the_bounded_plans_bits(heads):
    """The engine's recorded programs pass the length as a device tensor and no bound, so the row-invariant
    kernel plans for every slot of the cache: in a 40k-slot cache (unused slots NaN) that plan gives every row
    of 1-, 17- and 65-node chains the bits of the plan bounded by the prefix."""
    from ddtree_chat.engine.ops import triton_mla_exact as ex

    dev = torch.device("cuda")
    chunk = ex.chunk_keys(heads)
    g = torch.Generator().manual_seed(heads + 1)
    ckv = torch.full((40960, 576), float("nan"), device=dev, dtype=BF16)
    for t in (1, 17, 65):
        for length in (5, chunk - 3, 3 * chunk + 130):
            ckv[:length + t] = torch.randn(length + t, 576, generator=g).to(dev, BF16)
            q = (torch.randn(t, heads, 576, generator=g) * 0.5).to(dev, BF16)
            mask = torch.ones(t, t, device=dev).tril().bool()
            args = (q[..., :512], q[..., 512:], ckv[:, :512], ckv[:, 512:], torch.tensor([length], device=dev),
                    mask, SCALE)
            whole, bounded = ex.mla_attention_exact(*args), ex.mla_attention_exact(*args, max_prefix=length)
            assert not whole.isnan().any(), f"{t} nodes at prefix {length}"
            assert torch.equal(whole, bounded), f"{t} nodes at prefix {length}"
            ckv[:length + t] = float("nan")


@pytest.mark.parametrize("kernel", ["dispatched", "cuda", "cuda-wide", "triton"])
def test_mla_attention_replays_in_a_cuda_graph(kernel):
    dev = torch.device("cuda")
    t, heads, cap = 17, 8, 5000
    attend = ops.mla_attention if kernel == "dispatched" else _mla_kernel(kernel, heads)[0]
    g = torch.Generator().manual_seed(5)
    ckv = torch.randn(cap, 576, generator=g).to(dev, BF16)
    q = torch.randn(t, heads, 576, generator=g).to(dev, BF16)
    mask = closure_mask(_tree(t, 5, g)[0]).to(dev)
    plen = torch.tensor([100], device=dev)
    run = lambda: attend(q[..., :512], q[..., 512:], ckv[:, :512], ckv[:, 512:], plen, mask, SCALE)  # noqa: E731
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=s):
            out = run()
    torch.cuda.current_stream().wait_stream(s)
    for length in (100, 1500, 4200, cap - t):
        plen.fill_(length)
        graph.replay()
        assert torch.equal(out, run()), length


def test_target_logits_of_a_tree_equal_the_ar_steps(k26):
    """The whole K2.6-shaped target: AR steps from a 1020-token context (crossing the 1024-key chunk
    boundary of 64 heads), then the same tokens verified as a chain inside 17- and 65-node trees, as an
    8-token block and as a prefill chunk: every chain node's logits equal the AR step's, and the latent
    rows a verify writes equal the AR step's."""
    from ddtree_chat.engine.kv_cache import KVCache

    cfg, model = k26
    dev = torch.device("cuda")
    cache = KVCache(cfg.num_layers, 4096, cfg.kv_lora_rank, cfg.qk_rope_head_dim, BF16, dev)
    g = torch.Generator().manual_seed(0)
    start, steps = 1020, 9
    prompt = torch.randint(0, cfg.vocab_size, (start,), generator=g).to(dev)
    with torch.no_grad():
        for lo in range(0, start, 256):  # the prompt in prefill chunks
            n = min(256, start - lo)
            cache.ensure_room(n)
            model(prompt[lo:lo + n], torch.arange(lo, lo + n, device=dev), torch.ones(n, n, dtype=torch.bool, device=dev).tril(), cache)
            cache.advance(n)
        tokens, ar_logits = [int(torch.randint(0, cfg.vocab_size, (1,), generator=g))], []
        one = torch.ones(1, 1, dtype=torch.bool, device=dev)
        for d in range(steps):
            cache.ensure_room(1)
            h, _ = model(torch.tensor([tokens[-1]], device=dev), torch.tensor([start + d], device=dev), one, cache)
            ar_logits.append(model.logits(h)[0])
            cache.advance(1)
            tokens.append(int(ar_logits[-1].argmax()))
        ar_rows = cache.ckv[:, start:start + steps].clone(), cache.kpe[:, start:start + steps].clone()
        for t, chain in ((17, steps), (65, steps), (8, 8), (steps, steps)):
            cache.truncate(start)
            parents, _ = _tree(t, chain, g)
            mask = closure_mask(parents).to(dev)
            depth = mask.sum(-1) - 1
            toks = torch.randint(0, cfg.vocab_size, (t,), generator=g)
            toks[:chain] = torch.tensor(tokens[:chain])
            cache.ensure_room(t)
            h, _ = model(toks.to(dev), (start + depth).to(dev), mask, cache)
            logits = model.logits(h)
            for d in range(chain):
                assert torch.equal(logits[d], ar_logits[d]), f"{t}-node verify, depth {d}"
            assert torch.equal(cache.ckv[:, start:start + chain], ar_rows[0][:, :chain]), f"{t}-node verify: latent rows"
            assert torch.equal(cache.kpe[:, start:start + chain], ar_rows[1][:, :chain]), f"{t}-node verify: rope rows"


def _decode(dec, prompt, mode, budget, n, drafter=None, temperature=0.0, top_p=1.0, seed=0):
    """The ids of n tokens after prompt through Decoder rounds (as Engine._generate runs them): greedy, or sampled
    at `temperature` with `seed` (each draw keyed by its token's position)."""
    from ddtree_chat.engine.sampling import target_choice

    if drafter is not None:
        dec.block_logits, dec.run_ahead = drafter, False
    logits = dec.prefill(prompt, drafting=mode != "ar")
    first = target_choice(logits[None], temperature, top_p, torch.tensor(seed, device=dec.device),
                          torch.tensor([len(prompt)], device=dec.device))
    out = [int(first)]
    dec.pending = out[0]
    while len(out) < n:
        r = dec.round(mode, budget, temperature, top_p, seed, frozenset(), n - len(out))
        out.extend(r.emitted)
    dec.__dict__.pop("block_logits", None)
    dec.run_ahead = None
    return out[:n]


def _continuation_drafter(dec, full: list[int], noise: int):
    """Drafts the AR sequence `full` (a wrong token first at every `noise`-th position, so paths get cut
    and siblings matter): deep trees whose chains the verify must reproduce exactly."""
    def draft(block, pos, ctx, mask=None):
        seq = list(dec.tokens) + [int(block[0])]
        vocab = dec.tcfg.vocab_size
        logp = torch.full((dec.block - 1, vocab), -30.0)
        on_path = full[:len(seq)] == seq
        for d in range(dec.block - 1):
            i = len(seq) + d
            good = full[i] if on_path and i < len(full) else (7 * i) % vocab
            bad = (good + 1 + i) % vocab
            if noise and (i % noise) == 0:
                logp[d, bad], logp[d, good] = -0.1, -2.5
            else:
                logp[d, good], logp[d, bad] = -0.05, -3.0
        return torch.log_softmax(logp, -1).to(block.device)
    return draft


@pytest.fixture(scope="module")
def k26_decoder(k26):
    from ddtree_chat.engine.ddtree import Decoder
    from ddtree_chat.engine.random_model import k26_draft_config, random_drafter

    cfg, model = k26
    dcfg = k26_draft_config(target_layers=2, layers=1)
    return Decoder(model, cfg, random_drafter(dcfg, "cuda", BF16), dcfg, max_len=2048)


def test_speculative_ids_equal_ar_with_deep_trees(k26_decoder):
    """Rounds run directly, drafts that follow the AR continuation (with cut paths): dflash and ddtree
    16/64 give the ar ids."""
    dec = k26_decoder
    g = torch.Generator().manual_seed(1)
    for p in range(4):
        prompt = torch.randint(0, dec.tcfg.vocab_size, (40 + 97 * p,), generator=g).tolist()
        want = _decode(dec, prompt, "ar", 0, 96)
        for mode, budget, noise in (("dflash", 7, 5), ("ddtree", 16, 4), ("ddtree", 64, 3)):
            got = _decode(dec, prompt, mode, budget, 96, _continuation_drafter(dec, prompt + want, noise))
            assert got == want, f"prompt {p}, {mode} {budget}: first difference at {next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)}"


@pytest.mark.parametrize("temperature, top_p", [(0.8, 1.0), (0.7, 0.95)])
def test_sampled_ids_equal_ar_with_deep_trees(k26_decoder, temperature, top_p):
    """At T > 0 (K2.6's dimensions, bf16): a tree node's logits are the AR step's bit for bit and its draw is keyed
    by position, so dflash and ddtree 16/64 sample the ar ids for the seed, drafts following them (paths cut)."""
    dec = k26_decoder
    g = torch.Generator().manual_seed(3)
    for p in range(3):
        prompt = torch.randint(0, dec.tcfg.vocab_size, (40 + 97 * p,), generator=g).tolist()
        kw = dict(temperature=temperature, top_p=top_p, seed=p)
        want = _decode(dec, prompt, "ar", 0, 96, **kw)
        assert want != _decode(dec, prompt, "ar", 0, 96, temperature=temperature, top_p=top_p, seed=p + 7)
        for mode, budget, noise in (("dflash", 7, 5), ("ddtree", 16, 4), ("ddtree", 64, 3)):
            got = _decode(dec, prompt, mode, budget, 96, _continuation_drafter(dec, prompt + want, noise), **kw)
            assert got == want, f"prompt {p}, {mode} {budget}: first difference at {next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)}"


def test_speculative_ids_equal_ar_in_cuda_graphs(k26_decoder):
    """12 prompts x 256 tokens, rounds recorded as CUDA graphs, the (random) drafter's own trees."""
    from ddtree_chat.engine.graphs import StaticRound

    dec = k26_decoder
    dec.graphs = StaticRound(dec, capture=True)
    try:
        with torch.no_grad():
            dec.graphs.warm([("ar", 0, False), ("dflash", 7, False), ("ddtree", 16, False)])
        assert dec.graphs.capture, "recording failed"
        g = torch.Generator().manual_seed(2)
        for p in range(12):
            prompt = torch.randint(0, dec.tcfg.vocab_size, (30 + 61 * p,), generator=g).tolist()
            want = _decode(dec, prompt, "ar", 0, 256)
            for mode, budget in (("dflash", 7), ("ddtree", 16)):
                assert _decode(dec, prompt, mode, budget, 256) == want, f"prompt {p}, {mode}"
    finally:
        dec.graphs = StaticRound(dec, capture=False)
