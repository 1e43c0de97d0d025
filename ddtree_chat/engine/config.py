"""Frozen configs parsed from config.json. This is the one place that knows the checkpoint quirks."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError


@dataclass(frozen=True)
class RopeScaling:
    """YaRN parameters (docs/architecture.md, the checkpoint). factor 1 with type None means plain rope."""

    type: str | None = None
    factor: float = 1.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None  # None: absent from config.json (HF then uses its default attention factor)
    mscale_all_dim: float | None = None

    @property
    def attention_factor(self) -> float:
        """Scale applied to cos/sin (HF/vLLM convention)."""
        if self.type != "yarn":
            return 1.0
        if self.mscale is not None and self.mscale_all_dim is not None:
            return yarn_mscale(self.factor, self.mscale) / yarn_mscale(self.factor, self.mscale_all_dim)
        return yarn_mscale(self.factor)

    @classmethod
    def from_json(cls, d: dict | None) -> "RopeScaling":
        if not d:
            return cls()
        kind = d.get("type", d.get("rope_type"))
        if kind not in ("yarn", "default", None):
            raise ConfigError(f"rope_scaling type {kind!r} is not supported (only yarn); check config.json.")
        if kind == "default":
            return cls()
        return cls(
            type="yarn",
            factor=float(d.get("factor", 1.0)),
            original_max_position_embeddings=int(d.get("original_max_position_embeddings", 4096)),
            beta_fast=float(d.get("beta_fast", 32.0)),
            beta_slow=float(d.get("beta_slow", 1.0)),
            mscale=float(d["mscale"]) if d.get("mscale") is not None else None,
            mscale_all_dim=float(d["mscale_all_dim"]) if d.get("mscale_all_dim") is not None else None,
        )


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@dataclass(frozen=True)
class QuantConfig:
    """compressed-tensors pack-quantized INT4, symmetric, per-group (docs/architecture.md, the checkpoint)."""

    num_bits: int = 4
    group_size: int = 32

    @classmethod
    def from_json(cls, q: dict | None) -> "QuantConfig | None":
        if not q:
            return None
        where = "quantization_config in config.json"
        if q.get("quant_method") != "compressed-tensors":
            raise ConfigError(f"{where}: quant_method {q.get('quant_method')!r} is not supported (need compressed-tensors).")
        if q.get("format", "pack-quantized") != "pack-quantized":
            raise ConfigError(f"{where}: format {q.get('format')!r} is not supported (need pack-quantized).")
        groups = q.get("config_groups") or {}
        if len(groups) != 1:
            raise ConfigError(f"{where}: expected exactly one config group, found {len(groups)}.")
        group = next(iter(groups.values()))
        w = group.get("weights") or {}
        if group.get("input_activations"):
            raise ConfigError(f"{where}: activation quantization is not supported.")
        checks = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group"}
        for key, want in checks.items():
            if w.get(key) != want:
                raise ConfigError(f"{where}: weights.{key} = {w.get(key)!r} is not supported (need {want!r}).")
        gs = int(w.get("group_size") or 0)
        if gs <= 0 or gs % 8:
            raise ConfigError(f"{where}: group_size {gs} is not supported (need a positive multiple of 8).")
        return cls(num_bits=4, group_size=gs)


@dataclass(frozen=True)
class TargetConfig:
    """The K2 / DeepSeek-V3 text backbone."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    intermediate_size: int
    moe_intermediate_size: int
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    first_k_dense_replace: int
    n_group: int
    topk_group: int
    routed_scaling_factor: float
    norm_topk_prob: bool
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...]
    quant: QuantConfig | None
    layout: str  # "k25" (nested, language_model. prefix) or "k2" (flat, model. prefix)
    name: str = "model"
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        scale = self.qk_head_dim**-0.5
        rs = self.rope_scaling
        if rs.type == "yarn" and rs.mscale_all_dim:
            m = yarn_mscale(rs.factor, rs.mscale_all_dim)
            scale *= m * m
        return scale

    def is_moe_layer(self, i: int) -> bool:
        return self.n_routed_experts > 0 and i >= self.first_k_dense_replace

    @classmethod
    def from_json(cls, raw: dict, name: str = "model") -> "TargetConfig":
        layout = "k2"
        text = raw
        if "text_config" in raw:  # K2.5 / K2.6: vision-language wrapper
            layout = "k25"
            text = dict(raw["text_config"])
            text.setdefault("quantization_config", raw.get("quantization_config"))
        quant = QuantConfig.from_json(text.get("quantization_config") or raw.get("quantization_config"))
        if text.get("scoring_func", "sigmoid") != "sigmoid":
            raise ConfigError(f"scoring_func {text.get('scoring_func')!r} is not supported (need sigmoid).")
        if text.get("topk_method", "noaux_tc") != "noaux_tc":
            raise ConfigError(f"topk_method {text.get('topk_method')!r} is not supported (need noaux_tc).")
        eos = text.get("eos_token_id", raw.get("eos_token_id"))
        eos_ids = tuple(eos) if isinstance(eos, list) else ((int(eos),) if eos is not None else ())
        try:
            return cls(
                vocab_size=int(text["vocab_size"]),
                hidden_size=int(text["hidden_size"]),
                num_layers=int(text["num_hidden_layers"]),
                num_heads=int(text["num_attention_heads"]),
                q_lora_rank=int(text["q_lora_rank"]) if text.get("q_lora_rank") else None,
                kv_lora_rank=int(text["kv_lora_rank"]),
                qk_nope_head_dim=int(text["qk_nope_head_dim"]),
                qk_rope_head_dim=int(text["qk_rope_head_dim"]),
                v_head_dim=int(text["v_head_dim"]),
                intermediate_size=int(text["intermediate_size"]),
                moe_intermediate_size=int(text.get("moe_intermediate_size", 0)),
                n_routed_experts=int(text.get("n_routed_experts") or 0),
                num_experts_per_tok=int(text.get("num_experts_per_tok") or 0),
                n_shared_experts=int(text.get("n_shared_experts") or 0),
                first_k_dense_replace=int(text.get("first_k_dense_replace", 0)),
                n_group=int(text.get("n_group") or 1),
                topk_group=int(text.get("topk_group") or 1),
                routed_scaling_factor=float(text.get("routed_scaling_factor", 1.0)),
                norm_topk_prob=bool(text.get("norm_topk_prob", True)),
                rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
                rope_theta=float(text.get("rope_theta", 10000.0)),
                rope_scaling=RopeScaling.from_json(text.get("rope_scaling")),
                max_position_embeddings=int(text.get("max_position_embeddings", 4096)),
                eos_token_ids=eos_ids,
                quant=quant,
                layout=layout,
                name=name,
            )
        except KeyError as e:
            raise ConfigError(f"config.json is missing the field {e.args[0]!r}; is this a Kimi K2 checkpoint?") from None
        except (TypeError, ValueError) as e:
            raise ConfigError(f"config.json has a malformed value ({e}).") from None


@dataclass(frozen=True)
class DraftConfig:
    """A DFlash drafter (Qwen3-style GQA stack over target features; docs/architecture.md, the drafter)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    block_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling
    kv_window: int | None  # drafter context entries kept (None: all)

    @classmethod
    def from_json(cls, raw: dict) -> "DraftConfig":
        archs = raw.get("architectures") or []
        if archs and "DFlashDraftModel" not in archs:
            raise ConfigError(f"the drafter's architectures {archs} are not supported (need DFlashDraftModel).")
        dcfg = raw.get("dflash_config") or {}
        try:
            layer_ids = tuple(int(i) for i in dcfg["target_layer_ids"])
            block = int(raw.get("block_size", dcfg.get("block_size", 0)))
            window = dcfg.get("kv_window", raw.get("sliding_window") if raw.get("use_sliding_window") else None)
            return cls(
                hidden_size=int(raw["hidden_size"]),
                num_layers=int(raw["num_hidden_layers"]),
                num_heads=int(raw["num_attention_heads"]),
                num_kv_heads=int(raw.get("num_key_value_heads", raw["num_attention_heads"])),
                head_dim=int(raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"]),
                intermediate_size=int(raw["intermediate_size"]),
                vocab_size=int(raw["vocab_size"]),
                block_size=block,
                target_layer_ids=layer_ids,
                mask_token_id=int(dcfg.get("mask_token_id", raw.get("mask_token_id"))),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=float(raw.get("rope_theta", 10000.0)),
                rope_scaling=RopeScaling.from_json(raw.get("rope_scaling")),
                kv_window=int(window) if window else None,
            )
        except KeyError as e:
            raise ConfigError(f"the drafter's config.json is missing {e.args[0]!r}; is this a DFlash drafter?") from None
        except (TypeError, ValueError) as e:
            raise ConfigError(f"the drafter's config.json has a malformed value ({e}).") from None

    def check_against(self, target: TargetConfig) -> None:
        if self.hidden_size != target.hidden_size or self.vocab_size != target.vocab_size:
            raise ConfigError(
                f"the drafter (hidden {self.hidden_size}, vocab {self.vocab_size}) does not match the target "
                f"(hidden {target.hidden_size}, vocab {target.vocab_size}); pass the drafter made for this model."
            )
        bad = [i for i in self.target_layer_ids if not 0 <= i < target.num_layers]
        if bad:
            raise ConfigError(f"the drafter reads target layers {bad}, but the target has {target.num_layers} layers.")
        if self.block_size < 2:
            raise ConfigError(f"the drafter's block_size {self.block_size} is too small (need >= 2).")


def read_json(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{path} not found: {what} needs a config.json in that directory.")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path} is not valid JSON ({e}); re-download the checkpoint's config.json.") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} should hold a JSON object.")
    return data


def load_target_config(model_dir: str | Path) -> TargetConfig:
    model_dir = Path(model_dir).resolve()
    # NOTE: a bare "target"/"model" folder name says little; show its parent too (e.g. "demo/target").
    name = model_dir.name if model_dir.name not in ("target", "model") else f"{model_dir.parent.name}/{model_dir.name}"
    return TargetConfig.from_json(read_json(model_dir / "config.json", "the model"), name=name)


def load_draft_config(draft_dir: str | Path) -> DraftConfig:
    return DraftConfig.from_json(read_json(Path(draft_dir) / "config.json", "the drafter"))
