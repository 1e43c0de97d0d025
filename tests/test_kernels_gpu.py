"""Fast kernels vs their reference twins at K2.6 shapes and odd sizes (GPU tests skip without CUDA).

Tolerances: relative Frobenius error ||out - ref|| / ||ref||; bf16 outputs with fp32 accumulation
land near 2e-3..5e-3, so 1e-2 is the bound; NaN never passes. Router ids must match exactly."""

import pytest
import torch

from ddtree_chat.engine.ops import mla_attention, mla_attention_ref, moe_experts_ref, rms_norm_ref, route_ref
from ddtree_chat.engine.ops.cuda_moe import emulate_dequant, repack_scales, repack_words
from ddtree_chat.engine.ops.int4 import dequant_int4, quantize_int4
from ddtree_chat.engine.ops.moe import ExpertWeights
from ddtree_chat.engine.ops.registry import strict

from drafters import closure_mask
from int4_experts import random_experts

CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not CUDA, reason="needs CUDA")
K26_SCALE = 0.14468


@pytest.fixture(autouse=True)
def no_silent_fallback():
    """A kernel that fails, or declines a call its supports accepted, raises (registry strict mode)."""
    with strict():
        yield


def rel(a, b):
    a, b = a.double(), b.double()
    assert torch.isfinite(a).all(), "non-finite output"
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def test_repack_roundtrip_cpu():
    """The kernel layout inverts exactly to the checkpoint dequantisation (CPU, runs in CI)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(3, 48, 320, generator=g)
    packed, scale = quantize_int4(w, 32)
    scale = scale.to(torch.bfloat16)
    ref = dequant_int4(packed, scale, 32, torch.bfloat16).float()
    assert torch.equal(emulate_dequant(repack_words(packed), repack_scales(scale)), ref)


# ----------------------------------------------------------------------------------------------- MoE
def test_moe_default_variant_is_a_kernel_variant(monkeypatch):
    """The MoE kernel's tile variant by token count is one the library has (the GPU tests check every one
    built against the reference; the default build has PICKED only); DDTREE_MOE_VARIANT (read at import)
    forces one for benchmarks."""
    from ddtree_chat.engine.ops import cuda_moe

    monkeypatch.setattr(cuda_moe, "_FORCED", None)
    monkeypatch.delenv("DDTREE_MOE_SWEEP", raising=False)
    assert cuda_moe.built_variants() == cuda_moe.PICKED
    picks = {cuda_moe.default_variant(t) for t in range(1, 257)}
    # row-invariant: 18, 14 and 10 share every tile (docs/exactness.md); else the pipelined tiles first
    assert picks == {18, 14, 10}
    monkeypatch.setenv("DDTREE_EXACT", "0")
    assert {cuda_moe.default_variant(t) for t in range(1, 257)} == {16, 14, 10}
    assert picks | {16} == set(cuda_moe.PICKED)
    monkeypatch.setattr(cuda_moe, "_FORCED", "6")
    assert cuda_moe.default_variant(1) == cuda_moe.default_variant(64) == 6


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("inter", [2048, 256])  # full, and TP=8 slice of the intermediate
@pytest.mark.parametrize("tokens", [1, 3, 17, 63])
@pytest.mark.parametrize("skew", [False, True])
def test_moe_matches_reference(tokens, inter, skew):
    from ddtree_chat.engine.ops.cuda_moe import built_variants, moe_forward, pack_experts

    dev = torch.device("cuda")
    e, h, k = 16, 7168, 8
    ex = random_experts(e, h, inter, dev, seed=tokens)
    pe = pack_experts(ex)
    x = torch.randn(tokens, h, device=dev).to(torch.bfloat16)
    if skew:  # tree tokens share experts: > 8 pairs per expert -> several blocks per expert
        ids = torch.stack([torch.randperm(10, device=dev)[:k] for _ in range(tokens)])
    else:
        ids = torch.stack([torch.randperm(e, device=dev)[:k] for _ in range(tokens)])
    w = torch.rand(tokens, k, device=dev)
    ref = moe_experts_ref(x, ids, w, ex)
    for variant in built_variants():  # every tile/unroll variant built (all: DDTREE_MOE_SWEEP=1)
        out = moe_forward(x, ids, w, pe, variant=variant)
        assert out.shape == ref.shape and out.dtype == ref.dtype
        assert rel(out, ref) < 1e-2, variant


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("inter", [2048, 256])
def test_moe_residual_is_added_as_a_bf16_add_would(inter):
    """moe_forward(residual=r) equals r + moe_forward() bit for bit in bf16 (the add happens in the combine
    launch) at every token count's variant, and a float32 call adds outside with the same result."""
    from ddtree_chat.engine.ops.cuda_moe import moe_forward, pack_experts

    dev = torch.device("cuda")
    e, h, k = 16, 7168, 8
    pe = pack_experts(random_experts(e, h, inter, dev, seed=5))
    for tokens in (1, 5, 17):
        x = torch.randn(tokens, h, device=dev).to(torch.bfloat16)
        r = torch.randn(tokens, h, device=dev).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(e, device=dev)[:k] for _ in range(tokens)])
        w = torch.rand(tokens, k, device=dev)
        assert torch.equal(moe_forward(x, ids, w, pe, residual=r), r + moe_forward(x, ids, w, pe)), tokens
        xf, rf = x.float(), r.float()
        assert torch.equal(moe_forward(xf, ids, w, pe, residual=rf), rf + moe_forward(xf, ids, w, pe)), tokens


@gpu
@pytest.mark.gpu
def test_moe_experts_of_other_ranks_and_repeats():
    """ids of -1 (experts another rank holds) add nothing, a token with none here gets a zero row, and
    repeated calls give the same bits (no state left between launches)."""
    from ddtree_chat.engine.ops.cuda_moe import N_VARIANTS, built_variants, moe_forward, pack_experts

    dev = torch.device("cuda")
    e, h, inter, k, tokens = 16, 1024, 256, 8, 9
    ex = random_experts(e, h, inter, dev, seed=11)
    pe = pack_experts(ex)
    x = torch.randn(tokens, h, device=dev).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(e, device=dev)[:k] for _ in range(tokens)])
    ids[ids >= 12] = -1  # a quarter of the experts live elsewhere
    ids[4] = -1  # nothing of token 4 here
    w = torch.rand(tokens, k, device=dev)
    ref = moe_experts_ref(x, ids, w, ex)
    assert ref[4].abs().max() == 0
    for variant in built_variants():
        out = torch.stack([moe_forward(x, ids, w, pe, variant=variant) for _ in range(3)])
        assert torch.equal(out[0], out[1]) and torch.equal(out[0], out[2]), variant
        assert out[0, 4].abs().max() == 0, variant
        assert rel(out[0], ref) < 1e-2, variant
    unbuilt = [N_VARIANTS] + [v for v in range(N_VARIANTS) if v not in built_variants()][:1]
    for variant in unbuilt:  # past the library's count, or one only the sweep builds: refused, not run
        with pytest.raises(RuntimeError, match="ddt_moe_forward"):
            moe_forward(x, ids, w, pe, variant=variant)


@gpu
@pytest.mark.gpu
def test_moe_variants_replay_in_a_cuda_graph():
    """Every variant (those with programmatic dependent launch too) captured in a graph: each replay runs on
    new inputs and gives the bits of an eager call on them (a PDL kernel that read its predecessor's buffer
    before that finished would see the previous replay's values)."""
    from ddtree_chat.engine.ops.cuda_moe import built_variants, moe_forward, pack_experts

    dev = torch.device("cuda")
    e, h, inter, k, tokens = 32, 1024, 256, 8, 5
    pe = pack_experts(random_experts(e, h, inter, dev, seed=5))
    x = torch.randn(tokens, h, device=dev).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(e, device=dev)[:k] for _ in range(tokens)])
    w = torch.rand(tokens, k, device=dev)
    for variant in built_variants():
        moe_forward(x, ids, w, pe, variant=variant)  # warm (library load) outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = moe_forward(x, ids, w, pe, variant=variant)
        for seed in range(3):
            torch.manual_seed(seed)
            x.copy_(torch.randn_like(x, dtype=torch.float32))
            ids.copy_(torch.stack([torch.randperm(e, device=dev)[:k] for _ in range(tokens)]))
            graph.replay()
            assert torch.equal(out, moe_forward(x, ids, w, pe, variant=variant)), (variant, seed)


@gpu
@pytest.mark.gpu
def test_moe_dispatch_and_prepare():
    from ddtree_chat.engine.ops import moe_experts
    from ddtree_chat.engine.ops.cuda_moe import PackedExperts
    from ddtree_chat.engine.ops.moe import prepare_experts

    dev = torch.device("cuda")
    ex = random_experts(8, 512, 128, dev, seed=5)
    pe = prepare_experts(ex)
    assert isinstance(pe, PackedExperts)
    x = torch.randn(5, 512, device=dev).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(8, device=dev)[:4] for _ in range(5)])
    w = torch.rand(5, 4, device=dev)
    assert rel(moe_experts(x, ids, w, pe), moe_experts_ref(x, ids, w, ex)) < 1e-2


# ----------------------------------------------------------------------------------------------- router
@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 3, 17, 63, 256])
def test_router_matches_reference(tokens):
    from ddtree_chat.engine.ops.cuda_small import route_fast

    dev = torch.device("cuda")
    logits = torch.randn(tokens, 384, device=dev) * 2
    bias = torch.randn(384, device=dev) * 0.1
    ids, w = route_fast(logits, bias, 8, 2.827, True)
    rid, rw = route_ref(logits, bias, 8, 2.827)
    si, order = ids.sort(-1)
    ri, rorder = rid.sort(-1)
    assert torch.equal(si, ri)
    assert torch.allclose(w.gather(1, order), rw.gather(1, rorder), rtol=1e-5, atol=1e-6)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("experts,top_k", [(384, 8), (512, 8), (64, 6), (16, 2), (8, 8), (100, 32)])
@pytest.mark.parametrize("ties", [False, True])
def test_router_picks_in_order_with_ties_to_the_lower_index(experts, top_k, ties):
    """The kernel's picks in order: the highest biased score first, ties to the lower expert index (a stable
    descending sort's order), at every expert count the kernel takes; a token's picks do not depend on the
    other tokens in the launch."""
    from ddtree_chat.engine.ops.cuda_small import route_fast

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(experts + top_k)
    logits = torch.randn(17, experts, device=dev, generator=gen) * 2
    bias = torch.randn(experts, device=dev, generator=gen) * 0.1
    if ties:  # few distinct scores: whole runs of equal keys around the k-th
        logits, bias = logits.round(), torch.zeros_like(bias)
    ids, w = route_fast(logits, bias, top_k, 2.827, True)
    biased = torch.sigmoid(logits) + bias
    want = biased.sort(dim=-1, descending=True, stable=True).indices[:, :top_k]
    assert torch.equal(ids, want)
    picked = torch.sigmoid(logits).gather(1, want)
    assert torch.allclose(w, picked / picked.sum(-1, keepdim=True) * 2.827, rtol=1e-5, atol=1e-6)
    one_ids, one_w = route_fast(logits[5:6], bias, top_k, 2.827, True)
    assert torch.equal(one_ids, ids[5:6]) and torch.equal(one_w, w[5:6])


# ----------------------------------------------------------------------------------------------- rmsnorm
@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("rows,d", [(1, 7168), (63, 7168), (17, 1536), (3, 512), (256, 7168)])
@pytest.mark.parametrize("wdt", [torch.bfloat16, torch.float32])
def test_rms_norm_matches_reference(rows, d, wdt):
    from ddtree_chat.engine.ops.cuda_small import rms_norm_fast, rms_norm_residual_fast

    dev = torch.device("cuda")
    x = torch.randn(rows, d, device=dev).to(torch.bfloat16)
    r = torch.randn(rows, d, device=dev).to(torch.bfloat16)
    wt = (torch.rand(d, device=dev) + 0.5).to(wdt)
    assert rel(rms_norm_fast(x, wt, 1e-6), rms_norm_ref(x, wt, 1e-6)) < 1e-2
    y, s = rms_norm_residual_fast(x, r, wt, 1e-6)
    assert torch.equal(s, x + r)
    assert rel(y, rms_norm_ref(x + r, wt, 1e-6)) < 1e-2


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float32])
def test_rms_norm_reads_slices_of_a_fused_projection(dt):
    """The q / k / latent parts of one fused product: rows of one stride, and [T, heads, d] inside [T, W]."""
    from ddtree_chat.engine.ops.cuda_small import rms_norm_fast

    dev = torch.device("cuda")
    y = torch.randn(2, 17, 1536 + 512 + 64, device=dev).to(dt)
    wt = (torch.rand(512, device=dev) + 0.5).to(dt)
    for x in (y[..., 1536:2048], y[..., :1536].unflatten(-1, (3, 512)), y[0, :, 64:].unflatten(-1, (4, 512))):
        assert not x.is_contiguous()
        got = rms_norm_fast(x, wt, 1e-6)
        assert got.shape == x.shape and got.is_contiguous()
        assert rel(got, rms_norm_ref(x, wt, 1e-6)) < (1e-2 if dt == torch.bfloat16 else 1e-6)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float32])
def test_wide_rms_norm_dispatches_to_the_triton_kernel(dt):
    """Rows of >= triton_norm.MIN_D (K2.6's 7168 hidden, 1536 q_a slice) take the Triton norm through the
    dispatch; narrower rows the CUDA kernel; both against the reference, with and without the residual."""
    from ddtree_chat.engine.ops import add_rms_norm, add_rms_norm_ref, rms_norm
    from ddtree_chat.engine.ops.cuda_small import rms_norm_fast
    from ddtree_chat.engine.ops.triton_norm import rms_norm_triton

    dev = torch.device("cuda")
    tol = 1e-2 if dt == torch.bfloat16 else 1e-6
    for t in (1, 17, 256):
        y = torch.randn(t, 1536 + 576, device=dev).to(dt)
        for x in (torch.randn(t, 7168, device=dev).to(dt), y[:, :1536], torch.randn(t, 256, device=dev).to(dt)):
            wt = (torch.rand(x.shape[-1], device=dev) + 0.5).to(dt)
            got = rms_norm(x, wt, 1e-6)
            wide = rms_norm_triton(x, None, wt, 1e-6)[0] if x.shape[-1] >= 1024 else rms_norm_fast(x, wt, 1e-6)
            assert torch.equal(got, wide)  # the dispatch took the kernel for its width
            assert rel(got, rms_norm_ref(x, wt, 1e-6)) < tol
            r = torch.randn(x.shape, device=dev).to(dt)
            yn, s = add_rms_norm(x, r, wt, 1e-6)
            yr, sr = add_rms_norm_ref(x, r, wt, 1e-6)
            assert torch.equal(s, sr) and rel(yn, yr) < tol


# ----------------------------------------------------------------------------------------------- rope
def _assert_kernel_served(kernel, got, want, dtype, what):
    """The dispatch's result is the kernel's (contiguous, in dtype) and close to the float64 reference."""
    assert kernel is not None and torch.equal(kernel, got), what
    assert got.dtype == dtype and got.is_contiguous()
    assert rel(got.double(), want) < (1e-6 if dtype == torch.float32 else 1e-2), what


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_dispatch_matches_reference_at_model_shapes(dtype):
    """K2.6's q_pe (64 heads, 128 + 64 per head) and k_pe (512 + 64) slices, the demo's (4 heads, 32 + 16):
    one launch each, against the reference in float64 (the drafter's half layout: the norm + rope test)."""
    from ddtree_chat.engine.ops import apply_rope_interleaved, apply_rope_interleaved_ref
    from ddtree_chat.engine.ops.triton_rope import rope_triton

    dev = torch.device("cuda")
    for t in (1, 17, 257):
        ang = torch.rand(t, 64, device=dev, dtype=torch.float64) * 100
        for width, d, heads in [(192, 64, 64), (576, 64, None), (48, 16, 4)]:
            cos, sin = ang[:, : d // 2].cos(), ang[:, : d // 2].sin()
            x = torch.randn(t, *((heads,) if heads else ()), width, device=dev).to(dtype)[..., width - d:]
            got = apply_rope_interleaved(x, cos.to(dtype), sin.to(dtype), heads=heads is not None)
            want = apply_rope_interleaved_ref(x.double(), cos.to(dtype).double(), sin.to(dtype).double(),
                                              heads=heads is not None)
            kernel = rope_triton(x, cos.to(dtype), sin.to(dtype), heads is not None, True)
            _assert_kernel_served(kernel, got, want, dtype, (t, width, heads))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_rope_dispatch_matches_reference(dtype):
    """The drafter's q and k heads read in place from its fused q/k/v product (demo: 4 + 2 + 2 heads of
    64; a K2.6-sized drafter: 32 + 8 + 8 of 128): per-head RMSNorm then the half rope, one launch; q and k
    at once under their two norms (a per-head weight)."""
    from ddtree_chat.engine.ops import rms_norm_rope_half, rms_norm_rope_half_ref
    from ddtree_chat.engine.ops.triton_rope import rope_triton

    dev = torch.device("cuda")
    for nh, nkv, d in ((4, 2, 64), (32, 8, 128)):
        for t in (1, 8, 17):
            y = torch.randn(t, (nh + 2 * nkv) * d, device=dev).to(dtype)
            ang = torch.rand(t, d // 2, device=dev, dtype=torch.float64) * 100
            cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
            heads = (y[:, : nh * d].unflatten(-1, (nh, d)), y[:, nh * d : (nh + nkv) * d].unflatten(-1, (nkv, d)),
                     y[:, : (nh + nkv) * d].unflatten(-1, (nh + nkv, d)))  # q, k, and both under a per-head weight
            for i, x in enumerate(heads):
                w = (torch.rand(*((nh + nkv, d) if i == 2 else (d,)), device=dev) + 0.5).to(dtype)
                got = rms_norm_rope_half(x, w, 1e-6, cos, sin)
                want = rms_norm_rope_half_ref(x.double(), w.double(), 1e-6, cos.double(), sin.double())
                _assert_kernel_served(rope_triton(x, cos, sin, True, False, w, 1e-6), got, want, dtype, (nh, d, t))


# -------------------------------------------------------------------------------------- latent write
@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_latent_write_dispatch_matches_reference(dtype):
    """K2.6's latent (512 + 64, the kv_a part of the fused q_a + kv_a product) and the demo's (64 + 16), at
    consecutive slots (eager) and scattered device slots (graphs), 1..257 tokens; NaN-poisoned buffers: the
    kernel writes exactly its rows."""
    from ddtree_chat.engine.ops import latent_write, latent_write_ref
    from ddtree_chat.engine.ops.triton_latent import latent_write_triton

    dev = torch.device("cuda")
    for q, r, p in ((1536, 512, 64), (128, 64, 16)):
        for t in (1, 3, 17, 63, 257):
            kv = torch.randn(t, q + r + p, device=dev).to(dtype)[:, q:]
            w = (torch.rand(r, device=dev) + 0.5).to(dtype)
            ang = torch.rand(t, p // 2, device=dev) * 100
            cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
            for where in (4096 - t, torch.randperm(4096, device=dev)[:t]):
                bufs = [torch.full((4096, n), float("nan"), device=dev, dtype=dtype) for n in (r, p)]
                got = latent_write(kv, w, 1e-6, cos, sin, *[b.clone() for b in bufs], where)
                assert latent_write_triton(kv, w, 1e-6, cos, sin, *[b.clone() for b in bufs], where) is not None
                want = latent_write_ref(kv.double(), w.double(), 1e-6, cos.double(), sin.double(),
                                        *[b.double() for b in bufs], where)
                for a, b in zip(got, want):
                    assert torch.equal(a.isnan(), b.isnan())
                    assert rel(a.double().nan_to_num(), b.nan_to_num()) < (1e-6 if dtype == torch.float32 else 1e-2)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_move_rows_kernel_matches_reference_and_replays_in_a_graph(dtype):
    """An accepted path's rows (rising nodes, node 0 past the path's end) moved to consecutive slots, as
    the accept program does, for K2.6's 61 layers of 512 + 64 and the demo's latent; bit for bit, eager and
    replayed from a CUDA graph with the path changed in place."""
    from ddtree_chat.engine.ops import move_rows, move_rows_ref

    dev = torch.device("cuda")
    g = torch.Generator(device="cpu").manual_seed(0)
    for layers, r, p in ((61, 512, 64), (6, 64, 16)):
        bufs = [torch.randn(layers, 512, w, device=dev).to(dtype) for w in (r, p)]
        src, dst = torch.zeros(7, dtype=torch.long, device=dev), 300 + torch.arange(1, 8, device=dev)

        def new_path():
            nodes = sorted(torch.randperm(63, generator=g)[:4].add(1).tolist())
            src.copy_(300 + torch.tensor(nodes + [0] * 3))

        new_path()
        want = [b.clone() for b in bufs]
        move_rows_ref(*want, src, dst)
        move_rows(*bufs, src, dst)
        assert all(torch.equal(a, b) for a, b in zip(bufs, want))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            move_rows(*bufs, src, dst)
        for _ in range(3):
            new_path()
            move_rows_ref(*want, src, dst)
            graph.replay()
            torch.cuda.synchronize()
            assert all(torch.equal(a, b) for a, b in zip(bufs, want))


# ------------------------------------------------------------------------------------ drafter attention
@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_draft_attention_dispatch_matches_reference(dtype):
    """The demo drafter (8 slots, 4 heads / 2 kv, d = 64) and the K2.6 DFlash drafter (64 / 8, d = 128)
    over 0..5000 context entries, with a mask, the graphs' device count of held entries and neither."""
    from ddtree_chat.engine.ops import draft_attention, draft_attention_ref
    from ddtree_chat.engine.ops.triton_draft_attention import draft_attention_triton

    gen = torch.Generator(device="cuda").manual_seed(4)
    rnd = lambda *s: torch.randn(*s, device="cuda", generator=gen).to(dtype)  # noqa: E731
    for b, nh, nkv, d in [(8, 4, 2, 64), (8, 64, 8, 128)]:
        for n in (0, 1, 300, 5000):
            q, kb, vb = rnd(b, nh, d), rnd(b, nkv, d), rnd(b, nkv, d)
            kc, vc = rnd(n + 9, nkv, d)[:n], rnd(n + 9, nkv, d)[:n]
            visible = (torch.arange(n, device="cuda") < n - 3).expand(b, n)
            held = torch.tensor([max(n - 3, 0)], device="cuda")  # the graphs' form: a device count
            for mask in (None, torch.cat([visible, torch.ones(b, b, dtype=torch.bool, device="cuda")], -1), held):
                want = draft_attention_ref(q.double(), kc.double(), vc.double(), kb.double(), vb.double(), mask, d**-0.5)
                got = draft_attention(q, kc, vc, kb, vb, mask, d**-0.5)
                kernel = draft_attention_triton(q, kc, vc, kb, vb, mask, d**-0.5)
                assert kernel is not None and torch.equal(kernel, got)  # the dispatch took the kernel
                assert got.dtype == dtype and rel(got, want) < (1e-5 if dtype == torch.float32 else 2e-2), (b, nh, n)


# ------------------------------------------------------------------------------ top-k log-softmax
@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_topk_logprobs_dispatch_matches_reference(dtype):
    """The demo drafter's rows (7 x 8192) and K2.6's vocabulary (163840) at dflash's k = 1 and the tree
    budgets up to 256 (K2.6 from k = 128 is declined: slower than torch there): values within float32 rounding
    of log_softmax + topk, ids the same tokens (float32 logits have no ties at these sizes)."""
    from ddtree_chat.engine.ops import topk_logprobs, topk_logprobs_ref
    from ddtree_chat.engine.ops.triton_topk import topk_logprobs_triton

    gen = torch.Generator(device="cuda").manual_seed(5)
    for v in (8192, 163840):
        x = (torch.randn(7, v, device="cuda", generator=gen) * 4).to(dtype)
        for k in (1, 7, 32, 64, 256):
            want, want_ids = topk_logprobs_ref(x, k)
            got, ids = topk_logprobs(x, k)
            kernel = topk_logprobs_triton(x, k)
            if v == 163840 and k >= 128:
                assert kernel is None
            else:
                assert kernel is not None and torch.equal(kernel[1], ids)  # the dispatch took the kernel
            assert torch.allclose(got, want, atol=2e-5), (v, k, (got - want).abs().max())
            # equal values may swap (bf16 logits tie); the set of tokens and their log-probs must agree
            assert torch.allclose(torch.log_softmax(x.float(), -1).gather(1, ids), got, atol=2e-5)
            assert torch.equal(ids.sort(-1).values, want_ids.sort(-1).values) or dtype == torch.bfloat16


# ------------------------------------------------------------------------------------- running sums
@gpu
@pytest.mark.gpu
def test_row_cumsum_matches_reference_and_ignores_the_row_count():
    """Sorted probabilities (the top-p filter's input) of the demo's and K2.6's vocabularies and an odd one:
    within float32 rounding of torch.cumsum, and each row's sums bit for bit the same alone, in 2 rows or in
    65 (torch.cumsum's are not: its CUDA scan changes with the row count)."""
    from ddtree_chat.engine.ops import row_cumsum, row_cumsum_ref
    from ddtree_chat.engine.ops.triton_scan import row_cumsum_triton

    gen = torch.Generator(device="cuda").manual_seed(3)
    for v in (8192, 163840, 1000):
        x = torch.softmax(torch.randn(65, v, device="cuda", generator=gen) * 3, -1).sort(-1, descending=True).values
        full = row_cumsum(x)
        assert torch.equal(full, row_cumsum_triton(x))  # the dispatch took the kernel
        assert torch.allclose(full, row_cumsum_ref(x), atol=1e-5, rtol=1e-5), (v, (full - row_cumsum_ref(x)).abs().max())
        for rows in (slice(0, 1), slice(64, 65), slice(7, 9), slice(0, 17)):
            assert torch.equal(row_cumsum(x[rows]), full[rows]), (v, rows)


# ----------------------------------------------------------------------------------------------- MLA
def ancestor_mask(t, gen, device):
    parent = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, t)]
    return closure_mask(parent).to(device)


MLA_CASES = [(t, ctx, nh) for nh in (64, 8) for ctx in (1, 100, 4097) for t in (1, 3, 17, 63)]
MLA_CASES += [(1, 65536, 64), (17, 65536, 8), (63, 65536, 64), (256, 100, 64), (256, 4097, 8)]


def test_cuda_mla_plan_cpu(monkeypatch):
    """The CUDA MLA launch plan (pure arithmetic, CPU): a CTA per super from 8 supers of context when those
    CTAs fill three quarters of a wave, else a CTA per chunk; two row groups a CTA above 16 rows; the
    column split stays within one wave; tail slots reach the deepest node; a round whose partial states
    outgrow the scratch budget goes in several launches of the same plan."""
    from ddtree_chat.engine.ops import cuda_mla

    p = cuda_mla.plan(1, 8, 8192, 132, True)
    assert (p["F"], p["cs"], p["stages"], p["SH"], p["NTL"], p["nodes"]) == (1, 4, 2, 32, 1, 1)
    p = cuda_mla.plan(1, 8, 131072, 132, True)  # 64 super CTAs would leave most of a 264-CTA wave idle
    assert (p["F"], p["cs"], p["NSU"], p["SH"]) == (1, 1, 0, 512)  # 256 CTAs of two chunks + 1 tail: no split
    assert cuda_mla.plan(1, 64, 131072, 132, True)["F"] == 8  # 64 supers x 4 row blocks: 256 of 264
    assert cuda_mla.plan(17, 8, 131072, 132, True)["F"] == 8  # 64 supers x 9 row blocks fill it
    assert cuda_mla.plan(17, 8, 32768, 132, True)["F"] == 1  # 16 supers x 9 row blocks: fewer than a wave
    assert cuda_mla.plan(65, 8, 32768, 132, True)["F"] == 8  # 16 supers x 33 row blocks fill it
    assert cuda_mla.plan(1, 16, 32768, 132, True)["rg"] == 1
    # two row groups a CTA above 16 rows: one CTA an SM, whole columns, four stages where they fit
    p = cuda_mla.plan(17, 8, 32768, 132, True)
    assert (p["rg"], p["cs"], p["stages"], p["F"]) == (2, 1, 4, 1)  # 16 supers x 5 two-group blocks: under a wave
    assert cuda_mla.plan(17, 8, 32768, 188, False, per_sm=1)["stages"] == 2
    assert cuda_mla.plan(300, 8, 1000, 132, True)["NTL"] == 3  # depths up to 299 past a chunk's 255th key
    p = cuda_mla.plan(65, 64, 131072, 132, True)
    assert p["F"] == 8 and 1 <= p["nodes"] < 65
    assert (p["SH"] + p["NTL"]) * p["nodes"] * 64 * 514 * 4 <= cuda_mla.SCRATCH_BYTES
    monkeypatch.setattr(cuda_mla, "FORCE", {"F": 1, "cs": 4, "stages": 4})
    p = cuda_mla.plan(1, 8, 131072, 132, True)
    assert (p["F"], p["cs"], p["stages"]) == (1, 4, 4)
    assert cuda_mla.plan(1, 8, 131072, 132, False)["stages"] == 2  # four stages only where shared memory allows
    monkeypatch.setattr(cuda_mla, "FORCE", {})
    # 32k x 8 heads x 1 token: 128 chunk CTAs + 1 tail; two per SM (sm_90, 264 a wave) take a 2-way column split,
    # one per SM (sm_120's ~100 KB per SM: 188 a wave on 188 SMs) none
    assert cuda_mla.plan(1, 8, 32768, 132, True)["cs"] == 2
    assert cuda_mla.plan(1, 8, 32768, 188, False, per_sm=1)["cs"] == 1
    # the wide engine: 64-row CTAs, one an SM, whole columns, its own stages; the same F rule over 64-row blocks
    p = cuda_mla.plan(17, 8, 32768, 132, True, wide=True)
    assert (p["wide"], p["rg"], p["cs"], p["stages"], p["F"]) == (1, 1, 1, cuda_mla.WIDE_STAGES, 1)  # 48 < 132 CTAs
    assert cuda_mla.plan(17, 8, 131072, 132, True, wide=True)["F"] == 1  # 71 super CTAs x 3 blocks: under 3 waves
    assert cuda_mla.plan(65, 8, 131072, 132, True, wide=True)["F"] == 8  # x 9 blocks: 639 CTAs
    # a CTA per FC chunks taken in turn: fewest waves x (FC + 1/4); supers take one
    assert cuda_mla.plan(1, 8, 131072, 132, True, wide=True)["FC"] == 4  # 512 chunks: 129 CTAs, one wave
    assert cuda_mla.plan(1, 8, 65536, 132, True, wide=True)["FC"] == 2  # 256 chunks: 129 CTAs
    assert cuda_mla.plan(1, 8, 32768, 132, True, wide=True)["FC"] == 1  # 128 chunks: a wave already
    assert cuda_mla.plan(17, 8, 131072, 132, True, wide=True)["FC"] == 1  # 12 waves of one against 4 of four
    assert cuda_mla.plan(65, 8, 131072, 132, True, wide=True)["FC"] == 1  # supers
    p = cuda_mla.plan(1, 8, 131072, 132, True)  # narrow: two CTAs an SM, 264 a wave: 257 CTAs of two chunks
    assert (p["FC"], p["cs"]) == (2, 1)
    monkeypatch.setattr(cuda_mla, "FORCE", {"wide": 1, "cs": 4, "rg": 2, "stages": 4})  # narrow-only fields
    assert cuda_mla.plan(1, 8, 8192, 132, False, wide=True)["cs"] == 1
    assert cuda_mla.plan(1, 8, 8192, 132, False, wide=True)["stages"] == cuda_mla.WIDE_STAGES
    monkeypatch.setattr(cuda_mla, "FORCE", {"FC": 2})
    assert cuda_mla.plan(1, 8, 8192, 132, False, wide=True)["FC"] == 2
    assert cuda_mla.plan(65, 8, 131072, 132, True, wide=True)["FC"] == 1  # a super CTA takes its own chunks


CUDA_MLA_CASES = [(t, ctx, nh) for nh in (8, 64) for ctx in (1, 7, 255, 4097) for t in (1, 17, 65)]
CUDA_MLA_CASES += [(t, 131071, nh) for nh in (8, 64) for t in (1, 17)] + [(256, 2100, 64), (1024, 300, 8)]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("wide", [0, 1], ids=["narrow", "wide"])
@pytest.mark.parametrize("t,ctx,nh", CUDA_MLA_CASES)
def test_cuda_mla_matches_reference(t, ctx, nh, wide, monkeypatch):
    """csrc/mla_attention.cu (16-row CTAs) and csrc/mla_wide.cu (64-row CTAs) against their twin: odd key counts,
    random trees, NaN-poisoned unused slots, the cache's strided [S, 576] views, host and device (int32 / int64)
    prefix lengths, and the dispatched op where the knobs pick this engine."""
    from ddtree_chat import knobs
    from ddtree_chat.engine.ops import cuda_mla
    from ddtree_chat.engine.ops.cuda_mla import mla_attention_cuda, supported

    dev = torch.device("cuda")
    if wide and not cuda_mla.wide_fits(dev):
        pytest.skip("a wide CTA's shared memory does not fit this GPU")
    monkeypatch.setattr(cuda_mla, "FORCE", {"wide": wide})
    gen = torch.Generator().manual_seed(t * 1000 + ctx + nh)
    cap = ctx + t + 37
    ckv = torch.full((cap, 576), float("nan"), device=dev, dtype=torch.bfloat16)
    ckv[: ctx + t] = torch.randn(ctx + t, 576, device=dev).to(torch.bfloat16)
    latent, kpe = ckv[:, :512], ckv[:, 512:]
    q_lat = (torch.randn(t, nh, 512, device=dev) * 0.5).to(torch.bfloat16)
    q_pe = torch.randn(t, nh, 64, device=dev).to(torch.bfloat16)
    mask = ancestor_mask(t, gen, dev)
    assert supported(q_lat, q_pe, latent, kpe)
    ref = mla_attention_ref(q_lat, q_pe, latent, kpe, ctx, mask, K26_SCALE)
    out = mla_attention_cuda(q_lat, q_pe, latent, kpe, ctx, mask, K26_SCALE)
    assert rel(out, ref) < 1e-2
    for dt in (torch.int32, torch.int64):
        plen = torch.tensor([ctx], dtype=dt, device=dev)
        assert torch.equal(mla_attention_cuda(q_lat, q_pe, latent, kpe, plen, mask, K26_SCALE), out)
    if knobs.mla_kernel() == ("cuda-wide" if wide else "cuda"):  # the knob picks this engine: the dispatched op is it
        monkeypatch.setattr(cuda_mla, "FORCE", {})
        assert torch.equal(mla_attention(q_lat, q_pe, latent, kpe, ctx, mask, K26_SCALE), out)


@gpu
@pytest.mark.gpu
def test_cuda_mla_declines_what_it_cannot_serve():
    from ddtree_chat.engine.ops.cuda_mla import supported

    dev = torch.device("cuda")
    cache = torch.zeros(64, 576, device=dev, dtype=torch.bfloat16)
    bf = torch.bfloat16
    q, qp = torch.zeros(2, 8, 512, device=dev, dtype=bf), torch.zeros(2, 8, 64, device=dev, dtype=bf)
    assert supported(q, qp, cache[:, :512], cache[:, 512:])
    assert not supported(q.float(), qp.float(), cache[:, :512].float(), cache[:, 512:].float())  # float32: Triton
    assert not supported(q[..., :256], qp, cache[:, :256], cache[:, 512:])  # another latent width
    odd = torch.zeros(64, 580, device=dev, dtype=torch.bfloat16)[:, 2:578]
    assert not supported(q, qp, odd[:, :512], odd[:, 512:])  # rows not 16-byte aligned
    big, big_pe = torch.zeros(1025, 8, 512, device=dev, dtype=bf), torch.zeros(1025, 8, 64, device=dev, dtype=bf)
    assert not supported(big, big_pe, cache[:, :512], cache[:, 512:])  # more round nodes than the kernel holds


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("t,ctx,nh", MLA_CASES)
def test_mla_matches_reference(t, ctx, nh):
    from ddtree_chat.engine.ops.triton_mla import mla_attention_triton

    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(t * 1000 + ctx)
    cap = ctx + t + 37
    ckv = torch.full((cap, 576), float("nan"), device=dev, dtype=torch.bfloat16)  # NaN-poisoned unused slots
    ckv[: ctx + t] = torch.randn(ctx + t, 576, device=dev).to(torch.bfloat16)
    latent, kpe = ckv[:, :512], ckv[:, 512:]  # strided views, as a [S, 576] cache holds them
    q_lat = (torch.randn(t, nh, 512, device=dev) * 0.5).to(torch.bfloat16)
    q_pe = torch.randn(t, nh, 64, device=dev).to(torch.bfloat16)
    mask = ancestor_mask(t, gen, dev)
    ref = mla_attention_ref(q_lat, q_pe, latent, kpe, ctx, mask, K26_SCALE)
    out = mla_attention_triton(q_lat, q_pe, latent, kpe, ctx, mask, K26_SCALE)
    assert rel(out, ref) < 1e-2
    plen = torch.tensor([ctx], dtype=torch.int32, device=dev)  # device-resident length (CUDA-graph path)
    out2 = mla_attention_triton(q_lat, q_pe, latent, kpe, plen, mask, K26_SCALE, max_prefix=cap - t)
    assert rel(out2, ref) < 1e-2
    if (t, ctx) in ((17, 4097), (1, 100)):  # every tile the autotuner may pick
        from ddtree_chat.engine.ops.triton_mla import _CONFIGS
        for cfg in _CONFIGS:
            out3 = mla_attention_triton(q_lat, q_pe, latent, kpe, plen, mask, K26_SCALE, max_prefix=cap - t, config=cfg)
            assert rel(out3, ref) < 1e-2, cfg


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("r,p,nh,t", [(64, 16, 4, 1), (64, 16, 4, 9), (64, 16, 4, 33), (128, 32, 2, 17), (256, 64, 8, 5)])
def test_mla_small_latent_shapes(r, p, nh, t):
    """Small models (the demo: r=64, p=16, 4 heads) take the kernel too; every output row must be written."""
    from ddtree_chat.engine.ops.triton_mla import mla_attention_triton

    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(r + t)
    ctx = 300
    ckv = torch.randn(ctx + t + 5, r, device=dev).to(torch.bfloat16)
    kpe = torch.randn(ctx + t + 5, p, device=dev).to(torch.bfloat16)
    q_lat = torch.randn(t, nh, r, device=dev).to(torch.bfloat16)
    q_pe = torch.randn(t, nh, p, device=dev).to(torch.bfloat16)
    mask = ancestor_mask(t, gen, dev)
    ref = mla_attention_ref(q_lat, q_pe, ckv, kpe, ctx, mask, 0.2)
    assert rel(mla_attention_triton(q_lat, q_pe, ckv, kpe, ctx, mask, 0.2), ref) < 1e-2
    assert rel(mla_attention(q_lat, q_pe, ckv, kpe, ctx, mask, 0.2), ref) < 1e-2  # the dispatched (row-invariant) one
    # float32 models in CUDA graphs: a device length, IEEE float32 dots, NaN in the unused slots
    ckv32, kpe32 = ckv.float(), kpe.float()
    ckv32[ctx + t :], kpe32[ctx + t :] = float("nan"), float("nan")
    plen = torch.tensor([ctx], device=dev)  # NOTE: int64, as the engine's device state holds it
    q_t = q_lat.float().transpose(0, 1).contiguous().transpose(0, 1)  # [t, nh, r] read through strides (the model's form)
    ref32 = mla_attention_ref(q_lat.float(), q_pe.float(), ckv32, kpe32, ctx, mask, 0.2)
    out32 = mla_attention(q_t, q_pe.float(), ckv32, kpe32, plen, mask, 0.2)
    assert (out32 - ref32).abs().max() < 1e-5
    # eager (a host length): the row-invariant kernel too, so direct and recorded forwards round alike
    assert (mla_attention(q_lat.float(), q_pe.float(), ckv32, kpe32, ctx, mask, 0.2) - ref32).abs().max() < 1e-5


@gpu
@pytest.mark.gpu
def test_float32_moe_layers_fold_their_shared_expert_on_gpu(synthetic_pair):
    """A float32 model on CUDA joins each MoE layer's shared expert to its dense experts (one GLU and one
    down product): the layer's output equals the grouped reference plus the shared MLP."""
    from ddtree_chat.engine import Engine
    from ddtree_chat.engine.model import MoE

    eng = Engine.load(*synthetic_pair, device="cuda", graphs=False)
    moes = [layer.mlp for layer in eng.decoder.target.layers if isinstance(layer.mlp, MoE)]
    assert moes and all(m.experts.shared == 1 for m in moes)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for t in (1, 33):
        x = torch.randn(t, moes[0].cfg.hidden_size, device="cuda", generator=gen)
        for m in moes:
            c = m.cfg
            ids, w = route_ref(x @ m.gate.weight.float().T, m.gate.e_score_correction_bias, c.num_experts_per_tok,
                               c.routed_scaling_factor, c.n_group, c.topk_group, c.norm_topk_prob)
            routed = ExpertWeights(*(getattr(m.experts, f)[:-1] for f in ("gate", "up", "down")))
            want = moe_experts_ref(x, ids, w, routed) + m.shared_experts(x)
            assert rel(m(x), want) < 1e-5


@gpu
@pytest.mark.gpu
def test_engine_on_gpu_is_lossless():
    """The shipped demo pair on CUDA (float32, its default there): ddtree and dflash emit ar's ids at T=0.
    (bf16 at K2.6's dimensions: tests/test_exact_gpu.py.)"""
    from pathlib import Path

    from ddtree_chat.engine import Engine, GenerationConfig

    root = Path(__file__).resolve().parents[1] / "ddtree_chat" / "assets" / "demo"
    if not (root / "target" / "config.json").is_file():
        pytest.skip("demo assets absent")
    eng = Engine.load(root / "target", root / "draft", device="cuda")
    tok = eng.tokenizer
    for text in ("Return the sum of a list.", "Parse a date string.", "Reverse the words of a sentence."):
        ids = tok.render_chat([{"role": "user", "content": text}])
        outs = {m: list(eng.generate(ids, GenerationConfig(mode=m, budget=32, max_new_tokens=96)))[-1]
                for m in ("ar", "dflash", "ddtree")}
        assert outs["ddtree"]["token_ids"] == outs["ar"]["token_ids"] == outs["dflash"]["token_ids"]
        assert outs["ddtree"]["mean_accepted_length"] > 1.5


@gpu
@pytest.mark.gpu
def test_dispatch_picks_fast_kernels():
    from ddtree_chat.engine.ops import gpu as g
    from ddtree_chat.engine.ops.registry import fast

    x = torch.zeros(1, device="cuda", dtype=torch.bfloat16)
    assert {"moe_experts", "route", "rms_norm", "mla_attention", "rope", "matmul_nt", "draft_attention",
            "topk_logprobs", "latent_write", "move_rows", "pack_round"} <= set(g.enabled_ops)
    assert fast("moe_experts", x) is not None and fast("moe_experts", torch.zeros(1)) is None
    assert fast("moe_experts", x.float()) is None  # fp32 stays exact (mla: see test_mla_small_latent_shapes)


# ---------------------------------------------------------------------------------- small-M products
@gpu
@pytest.mark.gpu
def test_glu_product_matches_float64():
    """silu(x @ wg^T) * (x @ wu^T) in one launch: the demo's MLP (1 row), shared expert (33 tree rows),
    stacked dense experts (batched), and a K the kernel declines (two cuBLAS products + SiLU)."""
    from ddtree_chat.engine.ops import matmul_nt_glu
    from ddtree_chat.engine.ops.triton_linear import MAX_K, matmul_nt_glu_fast, matmul_nt_triton

    gen = torch.Generator(device="cuda").manual_seed(2)
    rnd = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    cases = [(rnd(1, 256), rnd(768, 256), rnd(768, 256)), (rnd(33, 256), rnd(128, 256), rnd(128, 256)),
             (rnd(17, 256), rnd(16, 128, 256), rnd(16, 128, 256)), (rnd(8, 1536), rnd(256, 1536), rnd(256, 1536))]
    for x, wg, wu in cases:
        xd = x.double()
        want = torch.nn.functional.silu(xd @ wg.double().transpose(-1, -2)) * (xd @ wu.double().transpose(-1, -2))
        kernel = (lambda a, g, u: matmul_nt_triton(a, g, w2=u),) if x.shape[-1] <= MAX_K else ()
        for fn in (matmul_nt_glu_fast, matmul_nt_glu) + kernel:
            got = fn(x, wg, wu)
            assert got.shape == want.shape and rel(got, want) < 1e-6, (x.shape, wg.shape)


@gpu
@pytest.mark.gpu
def test_mask_and_walk_dispatch_to_the_kernels_on_cuda():
    from ddtree_chat.engine.ops.triton_tree import ancestor_mask_triton, walk_commit_triton, walk_triton
    from ddtree_chat.engine.tree import build_tree_ref, walk_commit, walk_commit_ref, walk_topk, walk_topk_ref

    gen = torch.Generator().manual_seed(3)
    for d, k, b in [(7, 32, 32), (7, 4, 64), (15, 8, 256), (7, 8, 0)]:
        lp = torch.log_softmax(torch.randn(d, 200, generator=gen) * 3, -1)
        vals, ids = lp.topk(k, dim=-1)
        tree = build_tree_ref(torch.tensor([5]), vals, ids, b)
        tree.max_depth = d
        choice = tree.tokens.roll(-1).clone()  # agrees with the first chain (best-first: node i+1 under i, often)
        choice[torch.randint(0, tree.size, (3,), generator=gen)] = 7
        cuda = type(tree)(*(t.cuda() for t in (tree.tokens, tree.parents, tree.depth, tree.logprobs)), max_depth=d)
        assert torch.equal(cuda.mask().cpu(), tree.mask_ref())
        assert torch.equal(ancestor_mask_triton(cuda).cpu(), tree.mask_ref())
        ok, bonus = walk_topk(cuda, choice.cuda())
        rok, rbonus = walk_topk_ref(tree, choice)
        assert torch.equal(ok.cpu(), rok) and int(bonus) == int(rbonus)
        kok, kbonus = walk_triton(cuda, choice.cuda())  # the kernel itself, in case the dispatch fell back
        assert torch.equal(kok.cpu(), rok) and int(kbonus) == int(rbonus)
        for drafting in (True, False):  # the round's bookkeeping, through the dispatch and the kernel itself
            rstate = torch.tensor([100, 30, 2])
            want = walk_commit_ref(tree, choice, rstate, drafting)
            for fn in (walk_commit, walk_commit_triton):
                state = torch.tensor([100, 30, 2], device="cuda")
                got = fn(cuda, choice.cuda(), state, drafting)
                assert all(torch.equal(x.cpu(), y) for x, y in zip(got, want)) and torch.equal(state.cpu(), rstate)

@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 17, 65, 600])  # NOTE: one compile per tile height (16 / 32 / 64 rows)
@pytest.mark.parametrize("k,n", [(256, 128), (256, 8192), (1536, 256), (100, 17)])
@pytest.mark.parametrize("entry", ["triton", "fma", "fast"])
def test_triton_matmul_nt_matches_float64(m, k, n, entry):
    """float32 x @ w^T against a float64 product: float32-level error (3xTF32, not plain tf32; the FFMA
    form), masked edges (m, k, n not multiples of the tiles); the registered op also where it hands over
    to cuBLAS."""
    from ddtree_chat.engine.ops.triton_linear import matmul_nt_fast, matmul_nt_triton

    gen = torch.Generator(device="cuda").manual_seed(m + k + n)
    x = torch.randn(m, k, device="cuda", generator=gen)
    w = torch.randn(n, k, device="cuda", generator=gen)
    fma = lambda a, b: matmul_nt_triton(a, b, "fma")  # noqa: E731
    out = {"triton": matmul_nt_triton, "fma": fma, "fast": matmul_nt_fast}[entry](x, w)
    assert out.shape == (m, n) and out.dtype == torch.float32
    assert rel(out, x.double() @ w.double().T) < 1e-6


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("m,k,n", [(33, 256, 208), (33, 128, 192), (17, 256, 8192), (8, 256, 8192), (1, 256, 208)])
def test_rms_norm_linear_matches_float64(m, k, n):
    """The norm folded into the product (a verify's q_a/kv_a, q_b, lm head): float32-level error against
    float64, on a strided x (q is a slice of the q_a/kv_a product); rows the kernel does not serve (one,
    when FMA_ROWS leaves it to cuBLAS) decline to the separate ops."""
    from ddtree_chat.engine.ops import rms_norm_linear
    from ddtree_chat.engine.ops.triton_linear import FMA_ROWS, rms_norm_linear_fast

    gen = torch.Generator(device="cuda").manual_seed(m + k + n)
    x = torch.randn(m, k + 16, device="cuda", generator=gen)[:, :k]
    nw = torch.rand(k, device="cuda", generator=gen) + 0.5
    w = torch.randn(n, k, device="cuda", generator=gen)
    xd = x.double()
    want = (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * nw.double()) @ w.double().T
    fused = rms_norm_linear_fast(x, nw, 1e-6, w)
    assert (fused is None) == (m == 1 and m not in FMA_ROWS)
    for out in ([fused] if fused is not None else []) + [rms_norm_linear(x, nw, 1e-6, w)]:
        assert out.shape == (m, n) and rel(out, want) < 1e-6


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("m,k", [(1, 128), (33, 128), (33, 2048), (600, 256)])
def test_linear_add_matches_float64(m, k):
    """A layer's last product with the residual added in its store: the Triton kernel (33 rows; split-K
    at K = 2048, the dense MoE's concatenated down product) or cuBLAS's addmm (1 and 600 rows, bf16)."""
    from ddtree_chat.engine.ops import linear_add
    from ddtree_chat.engine.ops.triton_linear import linear_add_fast

    gen = torch.Generator(device="cuda").manual_seed(m + k)
    x, w = torch.randn(m, k, device="cuda", generator=gen), torch.randn(256, k, device="cuda", generator=gen)
    res = torch.randn(m, 256, device="cuda", generator=gen)
    want = res.double() + x.double() @ w.double().T
    for out in (linear_add_fast(x, w, res), linear_add(x, w, res)):
        assert out.shape == (m, 256) and rel(out, want) < 1e-6
    bf = [t.bfloat16() for t in (x, w, res)]  # bf16 (K2.6's shared experts): cuBLAS's addmm
    for out in (linear_add_fast(*bf), linear_add(*bf)):
        assert out.dtype == torch.bfloat16 and rel(out, want) < 2e-2


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 33, 65])
def test_dense_moe_routed_glu_matches_float64(t):
    """The demo's dense experts (16 x 128 x 256, top 4): the routed GLU kernel (ids -1 included) against
    float64, and the whole two-launch dense MoE against the grouped reference."""
    from ddtree_chat.engine.ops import moe_experts_dense, moe_experts_ref, routed_glu
    from ddtree_chat.engine.ops.moe import ExpertWeights, prepare_experts
    from ddtree_chat.engine.ops.triton_linear import routed_glu_fast

    gen = torch.Generator(device="cuda").manual_seed(t)
    e, i, h = 16, 128, 256
    x = torch.randn(t, h, device="cuda", generator=gen)
    wg, wu = (torch.randn(e, i, h, device="cuda", generator=gen) * h**-0.5 for _ in range(2))
    wd = torch.randn(e, h, i, device="cuda", generator=gen) * i**-0.5
    ids = torch.stack([torch.randperm(e, device="cuda", generator=gen)[:4] for _ in range(t)])
    ids[0, 2] = -1  # another rank's expert
    w = torch.rand(t, 4, device="cuda", generator=gen)
    dense = torch.zeros(t, e + 1, dtype=torch.float64, device="cuda").scatter_add_(1, ids + 1, w.double())[:, 1:]
    xd = x.double()
    want = torch.nn.functional.silu(xd @ wg.double().transpose(1, 2)) * (xd @ wu.double().transpose(1, 2))
    want = want.transpose(0, 1) * dense[:, :, None]  # [t, e, i]
    kernel = routed_glu_fast(x, wg, wu, ids, w)
    assert kernel is not None and kernel.shape == (t, e, i) and rel(kernel, want) < 1e-6
    assert torch.equal(routed_glu(x, wg, wu, ids, w), kernel)
    experts = prepare_experts(ExpertWeights(wg, wu, wd))
    assert torch.equal(experts.down, wd) and experts.down.permute(1, 0, 2).is_contiguous()
    got, ref = moe_experts_dense(x, ids, w, experts), moe_experts_ref(x, ids, w, experts)
    assert rel(got, ref) < 1e-5
    # the last expert as a shared one (MoE.fuse_projections): weight 1 for every token, never routed
    ids = ids.where(ids != e - 1, -1)
    joined = ExpertWeights(wg, wu, experts.down, shared=1)
    kernel = routed_glu_fast(x, wg, wu, ids, w, 1)
    xs = torch.nn.functional.silu(xd @ wg[-1].double().T) * (xd @ wu[-1].double().T)
    assert rel(kernel[:, e - 1], xs) < 1e-6
    assert rel(moe_experts_dense(x, ids, w, joined), moe_experts_ref(x, ids, w, joined)) < 1e-5


@gpu
@pytest.mark.gpu
def test_split_k_product_is_one_launch_and_replays():
    """The drafter's down projection ([8, 1536] x [256, 1536]) split over K in one launch: float32-level
    error in both forms (tensor-core dots, FFMA), the same result on every call and graph replay (its
    counters reset themselves)."""
    from ddtree_chat.engine.ops.triton_linear import SPLIT_K_CHUNK, _precision, matmul_nt_fast, matmul_nt_triton

    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(8, 1536, device="cuda", generator=gen)
    w = torch.randn(256, 1536, device="cuda", generator=gen)
    want = x.double() @ w.double().T
    for prec in ("tf32x3", "fma"):
        first = matmul_nt_triton(x, w, prec, split=6)
        assert rel(first, want) < 1e-6 and torch.equal(matmul_nt_triton(x, w, prec, split=6), first)
    first = matmul_nt_triton(x, w, _precision(8, 256, SPLIT_K_CHUNK, False), split=6)  # the dispatch's form
    out = matmul_nt_fast(x, w)  # the registered op takes split-K here; this call is the capture's warm-up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = matmul_nt_fast(x, w)
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, first)


@gpu
@pytest.mark.gpu
def test_triton_matmul_nt_batched_and_strided():
    """The forms the model uses: a shared 2-D x against stacked experts, per-head views (transposed,
    non-contiguous) and a per-token weighted sum with a permuted operand."""
    from ddtree_chat.engine.ops.triton_linear import matmul_nt_triton

    gen = torch.Generator(device="cuda").manual_seed(1)
    rnd = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    x, experts = rnd(33, 256), rnd(16, 128, 256)
    q, w_uk = rnd(9, 4, 48)[..., :32], rnd(4, 32, 64)  # [T, h, dn] slice, [h, dn, r]
    dense, y = rnd(17, 1, 16), rnd(16, 17, 256)
    cases = [(x, experts), (q.transpose(0, 1), w_uk.transpose(1, 2)), (dense, y.permute(1, 2, 0))]
    for a, b in cases:
        want = torch.matmul(a.double(), b.double().transpose(-1, -2))
        got = matmul_nt_triton(a, b)
        assert got.shape == want.shape
        assert rel(got, want) < 1e-6
    # a head-transposed x keeps its layout in the output: transposed back, it flattens without a copy
    o = matmul_nt_triton(rnd(9, 4, 64).transpose(0, 1), rnd(4, 32, 64))
    assert o.transpose(0, 1).is_contiguous() and o.transpose(0, 1).flatten(1).data_ptr() == o.data_ptr()


@gpu
@pytest.mark.gpu
def test_prefer_library_keeps_products_off_the_triton_kernel():
    """Inside registry.prefer_library() (a prefill, an eager round: forwards launched from Python) every
    registered float32 product takes the library path, float32-accurate, with no Triton product launched;
    outside it the kernel serves the same call."""
    from torch.profiler import ProfilerActivity, profile

    from ddtree_chat.engine.ops import linear_add, matmul_nt, matmul_nt_glu, rms_norm_linear, routed_glu
    from ddtree_chat.engine.ops.registry import prefer_library

    gen = torch.Generator(device="cuda").manual_seed(5)
    rnd = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    x, w, wu, res = rnd(33, 256), rnd(128, 256), rnd(128, 256), rnd(33, 128)
    nw = torch.rand(256, device="cuda", generator=gen) + 0.5
    eg, eu = rnd(4, 128, 256), rnd(4, 128, 256)
    ids = torch.randint(0, 4, (33, 2), device="cuda", generator=gen)
    rw = torch.rand(33, 2, device="cuda", generator=gen)

    def calls():
        return [matmul_nt(x, w), matmul_nt_glu(x, w, wu), linear_add(x, w, res), rms_norm_linear(x, nw, 1e-6, w),
                routed_glu(x, eg, eu, ids, rw)]

    def kernels(fn):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            out = fn()
            torch.cuda.synchronize()
        return out, {e.key for e in prof.key_averages()}

    with prefer_library():
        lib, names = kernels(calls)
    assert not any("_mm_nt_kernel" in n for n in names)
    fast, names = kernels(calls)
    assert any("_mm_nt_kernel" in n for n in names)
    for a, b in zip(lib, fast):
        assert a.shape == b.shape and rel(a, b.double()) < 1e-6
    xd = x.double()
    assert rel(lib[0], xd @ w.double().T) < 1e-6 and rel(lib[2], res.double() + xd @ w.double().T) < 1e-6


@gpu
@pytest.mark.gpu
def test_linear_dispatch_serves_float32_and_row_invariant_bf16():
    from ddtree_chat.engine.ops import Linear, linear
    from ddtree_chat.engine.ops.registry import exact, fast

    assert fast("matmul_nt", torch.zeros(1, device="cuda")) is not None
    bf16 = fast("matmul_nt", torch.zeros(1, device="cuda", dtype=torch.bfloat16))
    assert (bf16 is not None) == exact()  # the row-invariant products (else cuBLAS: the reference)
    layer = Linear(64, 48, bias=True).cuda()
    x = torch.randn(2, 5, 64, device="cuda")
    with torch.no_grad():
        assert rel(layer(x), torch.nn.functional.linear(x.double(), layer.weight.double(), layer.bias.double())) < 1e-6
    y = layer(x)  # autograd on: the reference, which has a backward
    y.sum().backward()
    assert layer.weight.grad is not None and linear(x, layer.weight).shape == (2, 5, 48)


# ------------------------------------------------------------------------------------------ tree build
TREE_CASES = [(7, 32, 32), (7, 64, 64), (7, 1, 7), (3, 4, 5), (1, 8, 8), (7, 16, 16), (7, 256, 256), (15, 2, 9),
              (2, 3, 9), (7, 128, 128)]


def drafter_topk(d, k, vocab, gen, ties=False):
    logits = torch.randn(d, vocab, device="cuda", generator=gen) * 3
    if ties:
        logits = logits.round()  # many equal log-probs
    lp = torch.log_softmax(logits, -1)
    return lp.max(-1, keepdim=True) if k == 1 else lp.topk(k, dim=-1)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("d,k,b", TREE_CASES)
def test_tree_kernel_matches_reference(d, k, b):
    """(depths, top-K, budget): the ddtree sizes (K = budget), dflash's chain (K = 1), odd sizes."""
    from ddtree_chat.engine.ops.triton_tree import build_tree_triton
    from ddtree_chat.engine.tree import build_tree_ref

    gen = torch.Generator(device="cuda").manual_seed(d * 1000 + b)
    vals, ids = drafter_topk(d, k, 1000, gen)
    root = torch.tensor([7], device="cuda")
    ref = build_tree_ref(root, vals, ids, b)
    tokens, parents, depth, logp = build_tree_triton(root, vals, ids, b)
    assert torch.equal(tokens, ref.tokens) and torch.equal(parents, ref.parents) and torch.equal(depth, ref.depth)
    assert torch.allclose(logp, ref.logprobs, atol=1e-5)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("b", [16, 64, 256])
def test_tree_kernel_with_ties_builds_a_top_budget_tree(b):
    """With many equal scores the two may keep different (equally good) nodes: the kernel's tree must still
    be prefix-closed, parents first, depth = parent's + 1, and its path scores the reference's multiset."""
    from ddtree_chat.engine.ops.triton_tree import build_tree_triton
    from ddtree_chat.engine.tree import DraftTree, build_tree_ref, path_scores

    gen = torch.Generator(device="cuda").manual_seed(b)
    vals, ids = drafter_topk(7, b, 1000, gen, ties=True)
    tokens, parents, depth, logp = build_tree_triton(torch.tensor(3, device="cuda"), vals, ids, b)
    par, dep = parents.tolist(), depth.tolist()
    assert par[0] == -1 and all(0 <= par[i] < i and dep[i] == dep[par[i]] + 1 for i in range(1, b + 1))
    mine = path_scores(DraftTree(tokens, parents, depth, logp, max_depth=7)).sort().values
    ref = path_scores(build_tree_ref(torch.tensor(3, device="cuda"), vals, ids, b)).sort().values
    assert torch.allclose(mine, ref, atol=1e-4)


@gpu
@pytest.mark.gpu
def test_tree_dispatch_uses_the_kernel_and_falls_back_when_short():
    from ddtree_chat.engine.ops.registry import fast
    from ddtree_chat.engine.ops.triton_tree import build_tree_triton
    from ddtree_chat.engine.tree import build_tree

    gen = torch.Generator(device="cuda").manual_seed(0)
    vals, ids = drafter_topk(2, 3, 100, gen)
    root = torch.tensor(1, device="cuda")
    assert fast("build_tree", vals) is build_tree_triton and fast("build_tree", vals.cpu()) is None
    assert build_tree_triton(root, vals, ids, 9) is not None  # 3 + 9 candidates hold 9 nodes
    assert build_tree_triton(root, vals, ids, 20) is None  # only 12 candidates: the reference builds 12
    assert build_tree(root, vals, ids, 20).size == 13
