"""Shared constants of the demo pipeline: sizes, special tokens, the chat format."""

from __future__ import annotations

import json
from pathlib import Path

from ...engine.synthetic import quant_config, text_config
from ...engine.tokenizer import N_KIMI_SPECIALS as N_SPECIALS

SEED = 1234
BPE_VOCAB = 8192 - N_SPECIALS  # byte-level BPE ranks; specials follow

# Same format as the engine's built-in fallback (tokenizer.FALLBACK_TEMPLATE); shipped as chat_template.jinja.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_{{ m.role }}|>{{ m.role }}<|im_middle|>"
    "{% if m.role == 'assistant' %}<think></think>{% endif %}{{ m.content }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>"
    "{% if thinking %}<think>{% else %}<think></think>{% endif %}{% endif %}"
)

# Target: K2 architecture at small size (the shipped one; the code-continuation pair before it was 256 wide, MLP 768).
TARGET = dict(hidden=384, layers=6, heads=4, q_lora=128, kv_lora=64, nope=32, rope=16, v=32, inter=1152,
              moe_inter=128, experts=16, top_k=4, shards=4)


def set_target(spec: str) -> dict:
    """Override TARGET's sizes in place from "key=int,key=int" (a larger target: every module holds this dict)."""
    pairs = [p.split("=", 1) for p in spec.split(",") if p]
    bad = [p[0] for p in pairs if len(p) != 2 or p[0] not in TARGET or not p[1].isdigit()]
    if bad:
        raise ValueError(f"target settings must be key=integer with keys from {sorted(TARGET)}: {bad}")
    TARGET.update({k: int(v) for k, v in pairs})
    return TARGET


# Drafter: DFlash, block 8, reading target layers 1, 3 and 5 (the last: a 6-layer target is shallow).
# The shipped shape (3 x 1024 over the 384-wide distilled target; the code-continuation pair's was 3 x 1536):
# see ddtree_chat/assets/README.md.
DRAFT = dict(layers=3, heads=4, kv_heads=2, head_dim=64, inter=1024, block=8, target_layer_ids=[1, 3, 5])


def target_text_config(vocab: int, n_ranks: int) -> dict:
    # YaRN like K2.6 (smaller factor: trained at 1024, original window 1024, extended 32x).
    rope = {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 1024,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
    return text_config(TARGET, vocab, n_ranks, max_position_embeddings=32768, rope_scaling=rope)


def target_config(vocab: int, n_ranks: int) -> dict:
    """The nested kimi_k25 config.json (text_config + quantization_config), as K2.6 ships it."""
    text = target_text_config(vocab, n_ranks)
    text["quantization_config"] = quant_config()
    return {"model_type": "kimi_k25", "architectures": ["KimiK25ForConditionalGeneration"],
            "text_config": text, "bos_token_id": n_ranks, "eos_token_id": n_ranks + 1,
            "demo": "ddtree-chat demo coder (issue 7); see assets/README.md"}


def draft_config(vocab: int, n_ranks: int, target_hidden: int | None = None, **overrides) -> dict:
    """The drafter's config.json; overrides replace DRAFT entries (e.g. layers=3, inter=2048); target_hidden:
    the target's width (default TARGET's)."""
    unknown = set(overrides) - set(DRAFT)
    if unknown:
        raise ValueError(f"unknown drafter settings {sorted(unknown)}")
    d, h = dict(DRAFT, **overrides), target_hidden or TARGET["hidden"]
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


def heldout_prompts(n: int | None = None, max_user_chars: int = 600) -> list[dict]:
    """The first n test-split chat prompts shipped with the demo pair (ddtree_chat/assets/demo/heldout_prompts.json),
    those whose user text fits max_user_chars: the benchmarks' prompts."""
    from ...engine.default_model import shipped_demo_dirs

    found = shipped_demo_dirs()
    if found is None:
        raise FileNotFoundError("the shipped demo pair (ddtree_chat/assets/demo/) is not in this install")
    items = json.loads((found[0].parent / "heldout_prompts.json").read_text())
    return [x for x in items if len(x["user"]) <= max_user_chars][:n]
