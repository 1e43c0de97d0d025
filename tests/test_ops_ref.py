import math

import torch

from ddtree_chat.engine.config import RopeScaling, TargetConfig
from ddtree_chat.engine.ops import (apply_rope_half_ref, apply_rope_interleaved, mla_attention_naive_ref,
                                    mla_attention_ref, route_ref, rope_cos_sin, yarn_inv_freq)
from tree_oracle import build_tree_heap

K26_YARN = RopeScaling(type="yarn", factor=64, original_max_position_embeddings=4096, beta_fast=32, beta_slow=1,
                       mscale=1, mscale_all_dim=1)


def test_absorbed_mla_equals_naive():
    g = torch.Generator().manual_seed(0)
    h, dn, dv, r, p, prefix, t = 4, 16, 12, 32, 8, 9, 6
    q_nope, q_pe = torch.randn(t, h, dn, generator=g), torch.randn(t, h, p, generator=g)
    ckv, kpe = torch.randn(prefix + t + 3, r, generator=g), torch.randn(prefix + t + 3, p, generator=g)
    w_uk, w_uv = torch.randn(h, dn, r, generator=g), torch.randn(h, dv, r, generator=g)
    tree = build_tree_heap(0, torch.log_softmax(torch.randn(3, 4, generator=g), -1).sort(-1, descending=True).values,
                      torch.arange(4).repeat(3, 1), 5)
    mask = tree.mask()
    q_lat = torch.einsum("thd,hdr->thr", q_nope, w_uk)
    o_lat = mla_attention_ref(q_lat, q_pe, ckv, kpe, prefix, mask, 0.3)
    absorbed = torch.einsum("thr,hvr->thv", o_lat, w_uv)
    naive = mla_attention_naive_ref(q_nope, q_pe, ckv, kpe, w_uk, w_uv, prefix, mask, 0.3)
    assert torch.allclose(absorbed, naive, atol=1e-4, rtol=1e-4)


def test_interleaved_rope_rotates_adjacent_pairs():
    x = torch.randn(3, 8)
    inv = yarn_inv_freq(8, 10000.0, RopeScaling())
    pos = torch.tensor([0, 1, 7])
    cos, sin = rope_cos_sin(pos, inv, 1.0, torch.float32)
    y = apply_rope_interleaved(x, cos, sin)
    for t in range(3):
        for i in range(4):
            a = pos[t].item() * inv[i].item()
            c, s = math.cos(a), math.sin(a)
            x0, x1 = x[t, 2 * i].item(), x[t, 2 * i + 1].item()
            assert abs(y[t, 2 * i].item() - (x0 * c - x1 * s)) < 1e-5
            assert abs(y[t, 2 * i + 1].item() - (x1 * c + x0 * s)) < 1e-5
    assert not torch.allclose(y, apply_rope_half_ref(x, cos, sin))  # the NeoX layout is a different rotation


def test_yarn_frequencies_match_formula():
    dim, base = 64, 50000.0
    inv = yarn_inv_freq(dim, base, K26_YARN)

    def corr(rot):
        return dim * math.log(4096 / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = math.floor(corr(32)), math.ceil(corr(1))
    for i in range(dim // 2):
        extra = base ** (-2 * i / dim)
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        want = extra / 64 * ramp + extra * (1 - ramp)
        assert abs(inv[i].item() - want) <= 1e-12 * max(1.0, want)
    assert inv[0].item() == 1.0 and abs(inv[-1].item() - base ** (-62 / 64) / 64) < 1e-15


def test_k26_softmax_scale_and_attention_factor():
    raw = {"vocab_size": 8, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1, "kv_lora_rank": 4,
           "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "intermediate_size": 8,
           "rope_scaling": {"type": "yarn", "factor": 64, "original_max_position_embeddings": 4096,
                            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}
    cfg = TargetConfig.from_json(raw)
    assert abs(cfg.softmax_scale - 0.14468) < 1e-4
    assert cfg.rope_scaling.attention_factor == 1.0


def test_router_bias_selects_but_does_not_weight():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    bias = torch.tensor([0.0, 0.0, 5.0, 5.0])
    ids, w = route_ref(logits, bias, 2, 2.827)
    assert sorted(ids[0].tolist()) == [2, 3]  # the bias decides the selection
    s = torch.sigmoid(logits[0, [2, 3]])
    want = s / s.sum() * 2.827
    got = w[0][ids[0].argsort()]
    assert torch.allclose(got, want)  # weights from the unbiased scores


def test_attention_with_a_device_length_equals_the_sliced_form():
    """Static shapes (graphs.py): the whole cache buffer under a length mask == the sliced reference."""
    g = torch.Generator().manual_seed(5)
    t, h, r, p, ctx, slots = 5, 3, 16, 8, 11, 40
    q_lat, q_pe = torch.randn(t, h, r, generator=g), torch.randn(t, h, p, generator=g)
    ckv, kpe = torch.randn(slots, r, generator=g), torch.randn(slots, p, generator=g)
    tree = build_tree_heap(0, torch.log_softmax(torch.randn(4, 6, generator=g), -1).topk(3).values,
                      torch.arange(12).view(4, 3), t - 1)
    mask = tree.mask()
    want = mla_attention_ref(q_lat, q_pe, ckv, kpe, ctx, mask, 0.3)
    got = mla_attention_ref(q_lat, q_pe, ckv, kpe, torch.tensor([ctx]), mask, 0.3)
    assert torch.allclose(got, want, atol=1e-6)
    ckv[ctx + t :] = 1e4  # what lies past the tree's slots must not matter
    assert torch.allclose(mla_attention_ref(q_lat, q_pe, ckv, kpe, torch.tensor([ctx]), mask, 0.3), want, atol=1e-6)


def test_dense_moe_equals_the_grouped_reference():
    from ddtree_chat.engine.ops import moe_experts_dense, moe_experts_ref
    from ddtree_chat.engine.ops.moe import ExpertWeights

    g = torch.Generator().manual_seed(2)
    e, hdim, inter, t, k = 6, 16, 8, 9, 2
    experts = ExpertWeights(torch.randn(e, inter, hdim, generator=g), torch.randn(e, inter, hdim, generator=g),
                            torch.randn(e, hdim, inter, generator=g))
    x = torch.randn(t, hdim, generator=g)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    ids[0, 1] = -1  # an expert held by another rank (expert parallel)
    w = torch.rand(t, k, generator=g)
    assert torch.allclose(moe_experts_dense(x, ids, w, experts), moe_experts_ref(x, ids, w, experts), atol=1e-4)
    # a shared expert folded in as the last one (MoE.fuse_projections): every token takes it at weight 1
    sg, su, sd = torch.randn(inter, hdim, generator=g), torch.randn(inter, hdim, generator=g), torch.randn(hdim, inter, generator=g)
    shared = torch.nn.functional.silu(x @ sg.T) * (x @ su.T) @ sd.T
    joined = ExpertWeights(torch.cat([experts.gate, sg[None]]), torch.cat([experts.up, su[None]]),
                           torch.cat([experts.down, sd[None]]), shared=1)
    want = moe_experts_ref(x, ids, w, experts) + shared
    assert torch.allclose(moe_experts_ref(x, ids, w, joined), want, atol=1e-4)
    assert torch.allclose(moe_experts_dense(x, ids, w, joined), want, atol=1e-4)


def test_grouped_product_experts_equal_the_per_expert_form():
    """The CPU reference's grouped products compute what one set of products per expert does: ids of -1
    skipped, an expert given every token, untouched experts, the shared expert folded in, 1-70 rows."""
    from ddtree_chat.engine.ops.moe import ExpertWeights, _routed_grouped_mm, _routed_per_expert, moe_experts_ref

    g = torch.Generator().manual_seed(3)
    e, hdim, inter, k = 8, 16, 8, 3
    experts = ExpertWeights(torch.randn(e, inter, hdim, generator=g), torch.randn(e, inter, hdim, generator=g),
                            torch.randn(e, hdim, inter, generator=g), shared=1)
    for t in (1, 2, 9, 70):
        x = torch.randn(t, hdim, generator=g)
        ids = torch.stack([torch.randperm(5, generator=g)[:k] for _ in range(t)])  # experts 5 and 6 untouched
        ids[:, 0] = 2  # one expert takes every token
        ids[0, 1] = -1
        w = torch.rand(t, k, generator=g)
        want, got = torch.zeros(t, hdim), torch.zeros(t, hdim)
        _routed_per_expert(want, x, ids, w, experts)
        _routed_grouped_mm(got, x, ids, w, experts)
        assert torch.allclose(got, want, atol=1e-5), t
        shared = torch.nn.functional.silu(x @ experts.gate[-1].T) * (x @ experts.up[-1].T) @ experts.down[-1].T
        assert torch.allclose(moe_experts_ref(x, ids, w, experts), want + shared, atol=1e-4), t
    none = torch.zeros(4, hdim)
    _routed_grouped_mm(none, torch.randn(4, hdim), torch.full((4, k), -1), torch.rand(4, k), experts)
    assert not none.any()  # every expert on another rank: nothing added


def test_cpu_dense_experts_equal_the_grouped_form(monkeypatch):
    """From DENSE_ROWS rows on, the CPU runs every routed expert on every row through packed products: the grouped
    form's values (ids of -1 skipped, the shared expert apart); fewer rows, DDTREE_CPU_EXACT=1's row-invariant
    forms and DDTREE_CPU_PACK=0 keep the grouped products."""
    from ddtree_chat.engine.ops import cpu_packed, moe
    from ddtree_chat.engine.ops.moe import ExpertWeights, _routed_grouped_mm, moe_experts_ref, prepare_experts

    if not cpu_packed.available(torch.float32):
        pytest.skip("this torch build has no packed CPU product")
    g = torch.Generator().manual_seed(4)
    e, hdim, inter, k = 9, 32, 16, 3
    experts = prepare_experts(ExpertWeights(*(torch.randn(e, *s, generator=g) for s in ((inter, hdim), (inter, hdim),
                                                                                          (hdim, inter))), shared=1))
    shared = lambda x: torch.nn.functional.silu(x @ experts.gate[-1].T) * (x @ experts.up[-1].T) @ experts.down[-1].T
    dense_calls = []
    real_dense = moe._routed_dense_cpu
    monkeypatch.setattr(moe, "_routed_dense_cpu", lambda out, x, *a: dense_calls.append(len(x)) or real_dense(out, x, *a))
    for t in (moe.DENSE_ROWS - 1, moe.DENSE_ROWS, 9, 70):
        x = torch.randn(t, hdim, generator=g)
        ids = torch.stack([torch.randperm(e - 1, generator=g)[:k] for _ in range(t)])
        ids[0, 1] = -1
        w = torch.rand(t, k, generator=g)
        want = torch.zeros(t, hdim)
        _routed_grouped_mm(want, x, ids, w, experts)
        torch.testing.assert_close(moe_experts_ref(x, ids, w, experts), want + shared(x), rtol=1e-5, atol=1e-4)
        assert (experts.stacked is not None) == (t >= moe.DENSE_ROWS) and (t in dense_calls) == (t >= moe.DENSE_ROWS), t
    gate, _, down, n = experts.stacked[1]
    assert n == e - 1 and cpu_packed.packable(gate) and cpu_packed.packable(down)
    routed = prepare_experts(ExpertWeights(experts.gate[:n], experts.up[:n], experts.down[:n]))
    moe_experts_ref(x, ids, w, routed)
    assert routed.stacked[1][2].data_ptr() == routed.down.data_ptr()  # no shared expert: views, no copy
    for env in ("DDTREE_CPU_EXACT", "DDTREE_CPU_PACK"):
        other = ExpertWeights(experts.gate, experts.up, experts.down, shared=1)
        with monkeypatch.context() as m:
            m.setenv(env, "1" if env == "DDTREE_CPU_EXACT" else "0")
            moe_experts_ref(x, ids, w, other)
        assert other.stacked is None or other.stacked[1] is None, env


def test_rope_table_serves_the_computed_values_bit_for_bit():
    """A reserved RopeTable gathers what rope_cos_sin computes (same float64 maths, one cast), so the
    engine's outputs do not change; without a reservation it computes per call."""
    from ddtree_chat.engine.config import RopeScaling
    from ddtree_chat.engine.ops import RopeTable, rope_cos_sin, yarn_inv_freq

    rs = RopeScaling(type="yarn", factor=32.0, original_max_position_embeddings=1024)
    inv = yarn_inv_freq(16, 50000.0, rs)
    pos = torch.tensor([0, 1, 7, 4095, 4100, 30000, 32767])
    for dtype in (torch.float32, torch.bfloat16):
        want = rope_cos_sin(pos, inv, rs.attention_factor, dtype)
        table = RopeTable()
        assert all(torch.equal(a, b) for a, b in zip(table.cos_sin(pos, inv, rs.attention_factor, dtype), want))
        assert not table.tables  # not reserved: computed
        table.reserve(32768)
        got = table.cos_sin(pos, inv, rs.attention_factor, dtype)
        assert all(torch.equal(a, b) for a, b in zip(got, want)) and dtype in table.tables
        table.reset()
        assert table.n == 32768 and not table.tables


def test_decoder_reserves_rope_positions_for_its_context(synthetic_pair):
    from ddtree_chat.engine import Engine
    from ddtree_chat.engine.ddtree import MAX_TREE_POSITIONS

    eng = Engine.load(*synthetic_pair, device="cpu", max_context=64)
    assert eng.target.rope_table.n == 64 + MAX_TREE_POSITIONS == eng.drafter.rope_table.n
    assert eng.target.rope_table.tables and eng.drafter.rope_table.tables  # built at load, before any capture


def test_latent_write_stores_the_normed_latent_and_roped_key_at_its_slots():
    """ops.latent_write (the cache write of a forward): rms_norm of c_kv and rope of k_pe at consecutive
    slots or at device slot indices, batched buffers too; nothing else in the buffers changes."""
    from ddtree_chat.engine.ops import latent_write, rms_norm_ref

    g = torch.Generator().manual_seed(0)
    kv = torch.randn(2, 3, 10 + 64 + 16, generator=g)[..., 10:]  # a slice of a fused projection
    w = torch.rand(64, generator=g) + 0.5
    ang = torch.randn(3, 8, generator=g)
    cos, sin = ang.cos(), ang.sin()
    ckv_want, kpe_want = rms_norm_ref(kv[..., :64], w, 1e-6), apply_rope_interleaved(kv[..., 64:], cos, sin)
    for where, rows in ((4, [4, 5, 6]), (torch.tensor([7, 0, 2]), [7, 0, 2])):
        ckv, kpe = torch.full((2, 9, 64), -1.0), torch.full((2, 9, 16), -1.0)
        out = latent_write(kv, w, 1e-6, cos, sin, ckv, kpe, where)
        assert out[0] is ckv and out[1] is kpe
        assert torch.allclose(ckv[:, rows], ckv_want) and torch.allclose(kpe[:, rows], kpe_want)
        rest = [i for i in range(9) if i not in rows]
        assert (ckv[:, rest] == -1).all() and (kpe[:, rest] == -1).all()
