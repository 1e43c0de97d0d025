"""Random in-memory targets (for K2.6-shaped timing on a GPU) and the per-forward byte model."""

import torch

from ddtree_chat.engine.model import causal_mask
from ddtree_chat.engine.memory import forward_bytes
from ddtree_chat.engine.random_model import k26_config, random_target

TINY = dict(vocab_size=512, hidden_size=64, num_attention_heads=2, q_lora_rank=32, kv_lora_rank=32,
            qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, intermediate_size=128,
            moe_intermediate_size=64, n_routed_experts=8, num_experts_per_tok=2)


def test_random_target_runs_with_int4_experts_on_cpu():
    cfg = k26_config(layers=3, **TINY)
    model = random_target(cfg, "cpu", torch.float32, seed=1)
    assert model.layers[1].mlp.experts.gate.shape == (8, 64, 64)
    h, _ = model(torch.tensor([1, 2, 3, 4]), torch.arange(4), causal_mask(4))
    logits = model.logits(h)
    assert logits.shape == (4, 512) and torch.isfinite(logits).all() and logits.std() > 0.1


def test_k26_forward_bytes_match_the_design_numbers():
    cfg = k26_config()
    one = forward_bytes(cfg, tokens=1, context=0)
    # K2.6's bytes per forward (weights as stored): attention ~12.3 GB, shared 5.3, dense 0.8, lm head 2.35, router 0.33, experts 11.9 at T=1
    for key, gb in (("attention", 12.3), ("shared_experts", 5.3), ("dense_mlp", 0.8), ("lm_head", 2.35),
                    ("router", 0.33), ("routed_experts", 11.9)):
        assert abs(one[key] / 1e9 - gb) / gb < 0.06, (key, one[key])
    assert abs(forward_bytes(cfg, 64, 0)["experts_touched_per_layer"] - 283) < 1.5
    assert forward_bytes(cfg, 1, 131072)["kv_cache"] > 9e9  # 70 KB/token read in full


def test_features_follow_the_feature_layers_order_with_repeats():
    """A drafter may list a target layer twice (the K2.6-shaped drafter over a 3-layer synthetic target)."""
    cfg = k26_config(layers=3, **TINY)
    model = random_target(cfg, "cpu", torch.float32, seed=1)
    toks, pos, mask = torch.tensor([1, 2, 3]), torch.arange(3), causal_mask(3)
    _, one = model(toks, pos, mask, feature_layers=(2, 0))
    _, rep = model(toks, pos, mask, feature_layers=(0, 1, 1, 2))
    h = cfg.hidden_size
    assert rep.shape[-1] == 4 * h and torch.equal(rep[..., h:2 * h], rep[..., 2 * h:3 * h])
    assert torch.equal(rep[..., :h], one[..., h:]) and torch.equal(rep[..., 3 * h:], one[..., :h])

