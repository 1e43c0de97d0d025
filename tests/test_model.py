"""Reference target: incremental decode == full sequence; AR greedy == step-by-step argmax of logits()."""

import torch

from ddtree_chat.engine import GenerationConfig
from ddtree_chat.engine.kv_cache import KVCache
from ddtree_chat.engine.model import causal_mask


def test_incremental_decode_matches_full_sequence(engine):
    model, cfg = engine.target, engine.tcfg
    ids = [3, 100, 42, 7, 511, 64, 9, 250]
    full = engine.logits(ids)
    cache = KVCache(cfg.num_layers, 64, cfg.kv_lora_rank, cfg.qk_rope_head_dim, torch.float32, "cpu")
    steps = [ids[:3], ids[3:4], ids[4:7], ids[7:]]
    rows, pos = [], 0
    for chunk in steps:
        t = len(chunk)
        h, _ = model(torch.tensor(chunk), torch.arange(pos, pos + t), causal_mask(t), cache)
        cache.commit(list(range(t)))
        rows.append(model.logits(h))
        pos += t
    assert torch.allclose(torch.cat(rows), full, atol=1e-4, rtol=1e-4)


def test_ar_greedy_is_deterministic_and_equals_argmax(engine):
    prompt = engine.tokenizer.encode("def add(a, b):")
    cfg = GenerationConfig(mode="ar", max_new_tokens=12, stop_token_ids=())
    runs = [list(engine.generate(prompt, cfg))[-1]["token_ids"] for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 12
    seq = list(prompt)
    for tok in runs[0]:
        assert int(engine.logits(seq)[-1].argmax()) == tok
        seq.append(tok)


def test_sampling_is_seeded(engine):
    prompt = engine.tokenizer.encode("hello")
    def run(seed):
        cfg = GenerationConfig(mode="ar", temperature=1.0, top_p=0.9, seed=seed, max_new_tokens=10, stop_token_ids=())
        return list(engine.generate(prompt, cfg))[-1]["token_ids"]
    assert run(1) == run(1)
    assert run(1) != run(2)


def test_stops_on_stop_token_and_context(engine):
    prompt = engine.tokenizer.encode("abc")
    first = list(engine.generate(prompt, GenerationConfig(mode="ar", max_new_tokens=5, stop_token_ids=())))[-1]
    stop_at = first["token_ids"][2]
    done = list(engine.generate(prompt, GenerationConfig(mode="ar", max_new_tokens=5, stop_token_ids=(stop_at,))))[-1]
    assert done["stop_reason"] == "stop_token" and done["token_ids"][-1] == stop_at
    assert stop_at not in done["token_ids"][:-1]


def test_drafter_attention_single_block_form_equals_sdpa(engine):
    """The engine's one-block attention (context and block scored apart) == the batched SDPA form."""
    attn = engine.drafter.layers[0].self_attn
    dt = next(attn.parameters()).dtype
    g = torch.Generator().manual_seed(3)
    b, n, hidden = engine.dcfg.block_size, 13, engine.dcfg.hidden_size
    x = torch.randn(b, hidden, generator=g).to(dt)
    k_ctx = torch.randn(n, attn.nkv, attn.d, generator=g).to(dt)
    v_ctx = torch.randn(n, attn.nkv, attn.d, generator=g).to(dt)
    cos, sin = engine.drafter.rope(torch.arange(n, n + b), dt)
    mask = torch.ones(b, n + b, dtype=torch.bool)
    mask[:, 9:n] = False  # context entries not held
    single = attn(x, cos, sin, k_ctx, v_ctx, mask)
    batched = attn(x[None], cos, sin, k_ctx[None], v_ctx[None], mask[None, None])[0]
    tol = 1e-5 if dt == torch.float32 else 3e-2
    assert torch.allclose(single.float(), batched.float(), atol=tol, rtol=tol)
    assert torch.allclose(attn(x, cos, sin, k_ctx[:9], v_ctx[:9]).float(), single.float(), atol=tol, rtol=tol)


def test_fused_projections_compute_the_same_and_share_the_weights(synthetic_pair):
    """Decoder stacks the products that read one input (MLA's q_a + kv_a, the drafter's q + k + v): same
    outputs, same state dict, the old parameters are views of the stacked weight (no second copy)."""
    from ddtree_chat.engine.loader import load_drafter, load_target

    tcfg, target = load_target(synthetic_pair[0], torch.device("cpu"), torch.float32)
    dcfg, drafter = load_drafter(synthetic_pair[1], tcfg, torch.device("cpu"), torch.float32)
    ids, pos, t = torch.tensor([3, 100, 42, 7, 511]), torch.arange(5), 5
    block = target.embed_tokens(torch.tensor([9] * dcfg.block_size))
    bpos = torch.arange(t, t + dcfg.block_size)

    def run():
        cache = KVCache(tcfg.num_layers, 16, tcfg.kv_lora_rank, tcfg.qk_rope_head_dim, torch.float32, "cpu")
        h, feats = target(ids, pos, causal_mask(t), cache, tuple(dcfg.target_layer_ids))
        ctx = drafter.context_kv(feats, pos)
        return [h, cache.ckv, cache.kpe, drafter(block, bpos, ctx)] + [x for kv in ctx for x in kv]

    g = torch.Generator().manual_seed(0)
    for layer in drafter.layers:  # distinct q/k norms: the fused per-head weight must keep them apart
        for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
            norm.weight.data = torch.rand(norm.weight.shape, generator=g) + 0.5
    before, state = run(), {k: v.clone() for k, v in {**target.state_dict(), **drafter.state_dict()}.items()}
    target.fuse_projections()
    drafter.fuse_projections()
    after = run()
    assert all(torch.allclose(a, b, atol=1e-5, rtol=1e-5) for a, b in zip(before, after))
    now = {**target.state_dict(), **drafter.state_dict()}
    assert now.keys() == state.keys() and all(torch.equal(now[k], v) for k, v in state.items())
    attn, dattn = target.layers[0].self_attn, drafter.layers[0].self_attn
    assert attn.kv_a_proj_with_mqa.weight.untyped_storage().data_ptr() == attn.qkv_a_weight.untyped_storage().data_ptr()
    assert dattn.v_proj.weight.untyped_storage().data_ptr() == dattn.qkv_weight.untyped_storage().data_ptr()
