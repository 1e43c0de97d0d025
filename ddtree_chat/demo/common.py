"""Shared constants of the demo pipeline: sizes, special tokens, the chat format."""

from __future__ import annotations

import json
from pathlib import Path

SEED = 1234
N_SPECIALS = 256
# Kimi's special-token layout (offsets from the first special id; DESIGN 2.4).
NAMED_SPECIALS = {
    0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
    10: "<|im_system|>", 17: "<|im_middle|>", 22: "<think>", 23: "</think>", 254: "[UNK]", 255: "[PAD]",
}
BPE_VOCAB = 8192 - N_SPECIALS  # byte-level BPE ranks; specials follow

# Kimi's pre-tokenizer without `&&` class intersection (general categories partition the code points).
_UPPER = r"[^\p{Han}\p{Ll}\p{N}\p{P}\p{S}\p{Z}\p{C}]"
_LOWER = r"[^\p{Han}\p{Lu}\p{Lt}\p{N}\p{P}\p{S}\p{Z}\p{C}]"
_SUFFIX = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
KIMI_PATTERN = "|".join([
    r"[\p{Han}]+",
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_SUFFIX}",
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_SUFFIX}",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])

# Same format as the engine's built-in fallback (DESIGN 2.4); shipped as chat_template.jinja.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_{{ m.role }}|>{{ m.role }}<|im_middle|>"
    "{% if m.role == 'assistant' %}<think></think>{% endif %}{{ m.content }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>"
    "{% if thinking %}<think>{% else %}<think></think>{% endif %}{% endif %}"
)

# Target: K2 architecture at small size.
TARGET = dict(hidden=256, layers=6, heads=4, q_lora=128, kv_lora=64, nope=32, rope=16, v=32, inter=768,
              moe_inter=128, experts=16, top_k=4, shards=4)
# Drafter: DFlash, block 8, reading target layers 1, 3 and 5 (the last: a 6-layer target is shallow).
DRAFT = dict(layers=2, heads=4, kv_heads=2, head_dim=64, inter=1024, block=8, target_layer_ids=[1, 3, 5])


def special_names(n_ranks: int) -> dict[int, str]:
    return {n_ranks + i: NAMED_SPECIALS.get(i, f"<|reserved_token_{i}|>") for i in range(N_SPECIALS)}


def target_text_config(vocab: int, n_ranks: int) -> dict:
    p = TARGET
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
        "rms_norm_eps": 1e-5, "rope_theta": 50000.0, "max_position_embeddings": 32768,
        # YaRN like K2.6 (smaller factor: trained at 1024, original window 1024, extended 32x).
        "rope_scaling": {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 1024,
                         "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
        "tie_word_embeddings": False, "bos_token_id": n_ranks, "eos_token_id": n_ranks + 1,
        "hidden_act": "silu", "attention_bias": False,
    }


def quant_config() -> dict:
    return {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                          "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                      "strategy": "group", "group_size": 32, "dynamic": False}}},
            "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|down)_proj.*"]}


def target_config(vocab: int, n_ranks: int) -> dict:
    """The nested kimi_k25 config.json (text_config + quantization_config), as K2.6 ships it."""
    text = target_text_config(vocab, n_ranks)
    text["quantization_config"] = quant_config()
    return {"model_type": "kimi_k25", "architectures": ["KimiK25ForConditionalGeneration"],
            "text_config": text, "bos_token_id": n_ranks, "eos_token_id": n_ranks + 1,
            "demo": "ddtree-chat demo coder (issue 7); see assets/README.md"}


def draft_config(vocab: int, n_ranks: int) -> dict:
    d, h = DRAFT, TARGET["hidden"]
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": h,
        "num_hidden_layers": d["layers"], "num_attention_heads": d["heads"], "num_key_value_heads": d["kv_heads"],
        "head_dim": d["head_dim"], "intermediate_size": d["inter"], "vocab_size": vocab, "rms_norm_eps": 1e-6,
        "rope_theta": 50000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 1024,
                         "beta_fast": 32.0, "beta_slow": 1.0},
        "block_size": d["block"], "max_position_embeddings": 32768, "tie_word_embeddings": False,
        "dflash_config": {"target_layer_ids": d["target_layer_ids"], "mask_token_id": n_ranks + 254},
    }


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=1) + "\n")
