"""Random-weight targets (and DFlash drafters) built directly in device memory (no checkpoint on disk), for
timing real K2.6 shapes on one GPU with fewer layers: `random_target(k26_config(layers=4), "cuda")`,
`random_drafter(k26_draft_config(target_layers=4), "cuda")`.

Routed experts are made in the compressed-tensors layout (random nibbles, bf16 group scales) and go
through the same load-time hook as a real checkpoint, so the fast kernels see what they would in use."""

from __future__ import annotations

import math

import torch

from .config import DraftConfig, RopeScaling, TargetConfig
from .drafter import DFlashDrafter
from .model import KimiModel, MoE
from .ops.int4 import Int4Weight
from .ops.moe import ExpertWeights, prepare_experts
from .parallel import SINGLE, TPGroup

K26_TEXT_CONFIG = {
    "vocab_size": 163840, "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 64,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 384,
    "num_experts_per_tok": 8, "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
    "routed_scaling_factor": 2.827, "norm_topk_prob": True, "rms_norm_eps": 1e-5, "rope_theta": 50000.0,
    "max_position_embeddings": 262144,
    "rope_scaling": {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                     "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
    "eos_token_id": 163585,
    "quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {
        "group_0": {"weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                                "group_size": 32}}}},
}


def k26_config(layers: int = 61, **overrides) -> TargetConfig:
    """K2.6's text config with `layers` layers (layer 0 dense, the rest MoE); overrides for scaled-down tests."""
    return TargetConfig.from_json(dict(K26_TEXT_CONFIG, num_hidden_layers=layers, **overrides), name=f"k26-random-{layers}L")


def k26_draft_config(target_layers: int, layers: int = 6, **overrides) -> DraftConfig:
    """The public Kimi DFlash drafter's shape (its model card: 6 layers, hidden 7168, 64/8 heads of 128,
    MLP 18432, block 8), reading six target layers spread over the `target_layers` a synthetic target has
    (repeats when it has fewer than six: the fc input keeps its real width)."""
    ids = tuple(round(j * (target_layers - 1) / 5) for j in range(6))
    base = dict(hidden_size=7168, num_layers=layers, num_heads=64, num_kv_heads=8, head_dim=128,
                intermediate_size=18432, vocab_size=163840, block_size=8, target_layer_ids=ids,
                mask_token_id=163838, rms_norm_eps=1e-6, rope_theta=50000.0,
                rope_scaling=RopeScaling(type="yarn", factor=64.0), kv_window=4096)
    return DraftConfig(**dict(base, **overrides))


def _random_state(module: torch.nn.Module, device, dtype, gen, embed: str | None = None) -> dict:
    """Norms 1, other matrices N(0, 1/fan_in) (the embedding N(0, 1)); the router's bias 0 in float32."""
    state = {}
    for name, ref in module.state_dict(keep_vars=True).items():
        if name.endswith("e_score_correction_bias"):
            state[name] = torch.zeros(ref.shape, device=device, dtype=torch.float32)
        elif ref.dim() == 1:  # norms
            state[name] = torch.ones(ref.shape, device=device, dtype=dtype)
        else:
            fan_in = ref.shape[1]
            gain = math.sqrt(fan_in) if name == embed else 1.0
            state[name] = (torch.randn(ref.shape, device=device, generator=gen) * (gain / math.sqrt(fan_in))).to(dtype)
    return state


def _random_module(make, device: torch.device, dtype, seed: int, embed: str | None = None):
    """make() built on the meta device, then given random weights on `device`: (module, its generator)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.device("meta"):
        module = make()
    module.load_state_dict(_random_state(module, device, dtype, gen, embed), assign=True, strict=True)
    module.reset_rope(device)
    return module, gen


@torch.no_grad()
def random_drafter(cfg: DraftConfig, device, dtype=torch.bfloat16, seed: int = 1, tp: TPGroup = SINGLE) -> DFlashDrafter:
    """tp: build one rank's shard (its heads, MLP slice and fc input features)."""
    drafter, _ = _random_module(lambda: DFlashDrafter(cfg, tp), torch.device(device), dtype, seed)
    return drafter.eval().requires_grad_(False)


def _random_int4(e: int, out: int, inp: int, group: int, device, gen, dtype) -> Int4Weight:
    packed = torch.randint(-2**31, 2**31 - 1, (e, out, inp // 8), dtype=torch.int32, device=device, generator=gen)
    # NOTE: scales ~ 1/(sqrt(in) * E[|q|]) keep activations O(1) through the random stack
    scale = torch.full((e, out, inp // group), 1.0 / (4.5 * math.sqrt(inp)), device=device, dtype=dtype)
    return Int4Weight(packed, scale, group)


@torch.no_grad()
def random_target(cfg: TargetConfig, device, dtype=torch.bfloat16, seed: int = 0, tp: TPGroup = SINGLE) -> KimiModel:
    """tp: build one rank's shard (its heads, vocabulary and MLP slices; routed experts split along the
    intermediate dim)."""
    device = torch.device(device)
    model, gen = _random_module(lambda: KimiModel(cfg, tp), device, dtype, seed, "embed_tokens.weight")
    h, i = cfg.hidden_size, cfg.moe_intermediate_size // tp.world
    g = cfg.quant.group_size if cfg.quant else 32
    for layer in model.layers:
        if isinstance(layer.mlp, MoE):
            experts = ExpertWeights(_random_int4(cfg.n_routed_experts, i, h, g, device, gen, dtype),
                                    _random_int4(cfg.n_routed_experts, i, h, g, device, gen, dtype),
                                    _random_int4(cfg.n_routed_experts, h, i, g, device, gen, dtype))
            if device.type == "cpu":  # the CPU reference path computes with dense weights
                experts = ExpertWeights(*(w.dequant(slice(None), dtype) for w in (experts.gate, experts.up, experts.down)))
            layer.mlp.experts = prepare_experts(experts)
    return model.eval().requires_grad_(False)
