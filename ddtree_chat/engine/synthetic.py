"""Random checkpoints with tiny dimensions in the exact Kimi K2.6 on-disk layout (and the DFlash format),
so tests and first runs exercise the real loading code.

    python -m ddtree_chat.engine.synthetic --out DIR --preset tiny --seed 0 [--layout k2]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from .ops.int4 import quantize_int4
from .synthetic_tokenizer import write_tiktoken_tokenizer

N_RANKS = 512
SPECIALS = 256
PRESETS = {
    # hidden, layers, heads, q_lora, kv_lora, nope, rope, v, inter, moe_inter, experts, top_k, shards
    "tiny": dict(hidden=64, layers=3, heads=4, q_lora=32, kv_lora=32, nope=16, rope=8, v=16, inter=128,
                 moe_inter=64, experts=8, top_k=2, shards=3, draft_layers=2, draft_heads=4, draft_kv=2,
                 draft_head_dim=16, draft_inter=128, block=8),
    "small": dict(hidden=1024, layers=8, heads=8, q_lora=256, kv_lora=128, nope=64, rope=32, v=64, inter=2048,
                  moe_inter=512, experts=64, top_k=4, shards=6, draft_layers=1, draft_heads=8, draft_kv=2,
                  draft_head_dim=64, draft_inter=1024, block=8),
}


K26_YARN = {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
            "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}


def text_config(p: dict, vocab: int, n_ranks: int = N_RANKS, max_position_embeddings: int = 262144,
                rope_scaling: dict = K26_YARN) -> dict:
    """The K2 text config.json fields for preset-style sizes `p` (see PRESETS)."""
    return {
        "model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"],
        "vocab_size": vocab, "hidden_size": p["hidden"], "num_hidden_layers": p["layers"],
        "num_attention_heads": p["heads"], "num_key_value_heads": p["heads"],
        "q_lora_rank": p["q_lora"], "kv_lora_rank": p["kv_lora"], "qk_nope_head_dim": p["nope"],
        "qk_rope_head_dim": p["rope"], "v_head_dim": p["v"], "intermediate_size": p["inter"],
        "moe_intermediate_size": p["moe_inter"], "n_routed_experts": p["experts"],
        "num_experts_per_tok": p["top_k"], "n_shared_experts": 1, "first_k_dense_replace": 1,
        "moe_layer_freq": 1, "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc",
        "scoring_func": "sigmoid", "norm_topk_prob": True, "routed_scaling_factor": 2.827,
        "rms_norm_eps": 1e-5, "rope_theta": 50000.0, "max_position_embeddings": max_position_embeddings,
        "rope_scaling": dict(rope_scaling), "tie_word_embeddings": False,
        "bos_token_id": n_ranks, "eos_token_id": n_ranks + 1, "hidden_act": "silu", "attention_bias": False,
    }


def quant_config() -> dict:
    """compressed-tensors INT4 group-32 for the routed experts only, as K2.6 ships it."""
    return {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                          "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                      "strategy": "group", "group_size": 32, "dynamic": False}}},
            "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|down)_proj.*"]}


class _Rand:
    def __init__(self, seed: int):
        self.g = torch.Generator().manual_seed(seed)

    def mat(self, out: int, inp: int, gain: float = 1.0) -> torch.Tensor:
        return (torch.randn(out, inp, generator=self.g) * gain / math.sqrt(inp)).to(torch.bfloat16)

    def norm(self, n: int) -> torch.Tensor:
        return (1.0 + 0.1 * torch.randn(n, generator=self.g)).to(torch.bfloat16)


def layer_tensors(p: dict, i: int, mat, norm, router_bias, expert) -> dict[str, torch.Tensor]:
    """Layer i's tensors under K2's names (no "model." prefix), the values from the makers, called in this
    fixed order: mat(out, inp, gain) and norm(n) for the dense weights and norms, router_bias(n) for the
    router's float32 bias, expert(out, inp) -> (weight_packed, weight_scale) per routed expert matrix."""
    h, nh = p["hidden"], p["heads"]
    b = f"layers.{i}."
    t = {b + "input_layernorm.weight": norm(h), b + "post_attention_layernorm.weight": norm(h)}
    a = b + "self_attn."
    t[a + "q_a_proj.weight"] = mat(p["q_lora"], h)
    t[a + "q_a_layernorm.weight"] = norm(p["q_lora"])
    t[a + "q_b_proj.weight"] = mat(nh * (p["nope"] + p["rope"]), p["q_lora"])
    t[a + "kv_a_proj_with_mqa.weight"] = mat(p["kv_lora"] + p["rope"], h)
    t[a + "kv_a_layernorm.weight"] = norm(p["kv_lora"])
    t[a + "kv_b_proj.weight"] = mat(nh * (p["nope"] + p["v"]), p["kv_lora"])
    t[a + "o_proj.weight"] = mat(h, nh * p["v"])
    m = b + "mlp."
    if i == 0:
        t[m + "gate_proj.weight"] = mat(p["inter"], h)
        t[m + "up_proj.weight"] = mat(p["inter"], h)
        t[m + "down_proj.weight"] = mat(h, p["inter"])
        return t
    t[m + "gate.weight"] = mat(p["experts"], h, 4.0)
    t[m + "gate.e_score_correction_bias"] = router_bias(p["experts"])
    for name, (o, k) in {"gate_proj": (p["moe_inter"], h), "up_proj": (p["moe_inter"], h),
                         "down_proj": (h, p["moe_inter"])}.items():
        t[f"{m}shared_experts.{name}.weight"] = mat(o, k)
        for e in range(p["experts"]):
            packed, scale = expert(o, k)
            t[f"{m}experts.{e}.{name}.weight_packed"] = packed
            t[f"{m}experts.{e}.{name}.weight_scale"] = scale
            t[f"{m}experts.{e}.{name}.weight_shape"] = torch.tensor([o, k], dtype=torch.int32)
    return t


def _target_tensors(p: dict, vocab: int, r: _Rand) -> dict[str, torch.Tensor]:
    h = p["hidden"]
    t: dict[str, torch.Tensor] = {"embed_tokens.weight": r.mat(vocab, h, math.sqrt(h)), "norm.weight": r.norm(h)}

    def expert(o, k):
        packed, scale = quantize_int4(r.mat(o, k).float(), 32)
        return packed, scale.to(torch.bfloat16)

    for i in range(p["layers"]):
        t.update(layer_tensors(p, i, r.mat, r.norm, lambda n: 0.1 * torch.randn(n, generator=r.g), expert))  # fp32
    t["lm_head.weight"] = r.mat(vocab, h)
    return t


def _write_shards(out: Path, tensors: dict[str, torch.Tensor], shards: int) -> None:
    names = list(tensors)
    per = math.ceil(len(names) / shards)
    weight_map, total = {}, 0
    for s in range(shards):
        fname = f"model-{s + 1:06d}-of-{shards:06d}.safetensors"
        part = {n: tensors[n].contiguous() for n in names[s * per : (s + 1) * per]}
        save_file(part, str(out / fname), metadata={"format": "pt"})
        for n, v in part.items():
            weight_map[n] = fname
            total += v.numel() * v.element_size()
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))


def make_target(out_dir: str | Path, preset: str = "tiny", seed: int = 0, layout: str = "k25") -> Path:
    p, out = PRESETS[preset], Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = N_RANKS + SPECIALS
    text = text_config(p, vocab)
    tensors = _target_tensors(p, vocab, _Rand(seed))
    if layout == "k25":
        text["quantization_config"] = quant_config()
        config = {"model_type": "kimi_k25", "architectures": ["KimiK25ForConditionalGeneration"],
                  "text_config": text, "vision_config": {"model_type": "moonvit", "hidden_size": 16},
                  "bos_token_id": N_RANKS, "eos_token_id": N_RANKS + 1}
        named = {("language_model.lm_head.weight" if n == "lm_head.weight" else "language_model.model." + n): v
                 for n, v in tensors.items()}
        g = torch.Generator().manual_seed(seed + 1)
        named["vision_tower.patch_embed.proj.weight"] = torch.randn(16, 3, 2, 2, generator=g).to(torch.bfloat16)
        named["mm_projector.proj.0.weight"] = torch.randn(16, 16, generator=g).to(torch.bfloat16)
    elif layout == "k2":
        config = dict(text, quantization_config=quant_config())
        named = {("lm_head.weight" if n == "lm_head.weight" else "model." + n): v for n, v in tensors.items()}
    else:
        raise ValueError(f"layout must be k25 or k2, not {layout!r}")
    (out / "config.json").write_text(json.dumps(config, indent=1))
    _write_shards(out, named, p["shards"])
    write_tiktoken_tokenizer(out, n_ranks=N_RANKS, seed=seed)
    return out


def make_drafter(out_dir: str | Path, preset: str = "tiny", seed: int = 0) -> Path:
    p, out = PRESETS[preset], Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    h, dh = p["hidden"], p["draft_head_dim"]
    layer_ids = sorted({1, p["layers"] - 1} | ({p["layers"] // 2} if p["layers"] > 3 else set()))
    config = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": h,
        "num_hidden_layers": p["draft_layers"], "num_attention_heads": p["draft_heads"],
        "num_key_value_heads": p["draft_kv"], "head_dim": dh, "intermediate_size": p["draft_inter"],
        "vocab_size": N_RANKS + SPECIALS, "rms_norm_eps": 1e-6, "rope_theta": 50000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096,
                         "beta_fast": 32.0, "beta_slow": 1.0},
        "block_size": p["block"], "max_position_embeddings": 262144, "tie_word_embeddings": False,
        "dflash_config": {"target_layer_ids": layer_ids, "mask_token_id": N_RANKS + 254},
    }
    r = _Rand(seed + 7)
    t = {"fc.weight": r.mat(h, len(layer_ids) * h), "hidden_norm.weight": r.norm(h), "norm.weight": r.norm(h)}
    for i in range(p["draft_layers"]):
        b = f"layers.{i}."
        t[b + "input_layernorm.weight"] = r.norm(h)
        t[b + "post_attention_layernorm.weight"] = r.norm(h)
        t[b + "self_attn.q_proj.weight"] = r.mat(p["draft_heads"] * dh, h)
        t[b + "self_attn.k_proj.weight"] = r.mat(p["draft_kv"] * dh, h)
        t[b + "self_attn.v_proj.weight"] = r.mat(p["draft_kv"] * dh, h)
        t[b + "self_attn.o_proj.weight"] = r.mat(h, p["draft_heads"] * dh)
        t[b + "self_attn.q_norm.weight"] = r.norm(dh)
        t[b + "self_attn.k_norm.weight"] = r.norm(dh)
        t[b + "mlp.gate_proj.weight"] = r.mat(p["draft_inter"], h)
        t[b + "mlp.up_proj.weight"] = r.mat(p["draft_inter"], h)
        t[b + "mlp.down_proj.weight"] = r.mat(h, p["draft_inter"])
    (out / "config.json").write_text(json.dumps(config, indent=1))
    save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def make_synthetic_pair(out_dir: str | Path, preset: str = "tiny", seed: int = 0, layout: str = "k25"):
    """Writes DIR/target and DIR/draft; returns (target_dir, draft_dir). Reuses them when present."""
    out = Path(out_dir)
    target, draft = out / "target", out / "draft"
    if not (target / "model.safetensors.index.json").is_file():
        make_target(target, preset, seed, layout)
    if not (draft / "model.safetensors").is_file():
        make_drafter(draft, preset, seed)
    return target, draft


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output directory (target/ and draft/ are written inside)")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layout", choices=["k25", "k2"], default="k25")
    a = ap.parse_args(argv)
    target, draft = make_synthetic_pair(a.out, a.preset, a.seed, a.layout)
    print(f"target: {target}\ndraft:  {draft}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
