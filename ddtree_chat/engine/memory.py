"""Memory planning before loading: per-rank weight bytes and the KV cache that fits (DESIGN 4)."""

from __future__ import annotations

from dataclasses import dataclass

from .config import TargetConfig
from .errors import DeviceError

_GIB = 1024**3
_RESERVE = 4 * _GIB  # activations, CUDA context, graphs, the drafter's share


def weight_bytes(cfg: TargetConfig, world: int = 1, expert_parallel: bool = False) -> int:
    """Bytes of target weights one rank holds (bf16 dense parts, INT4 + bf16 scales for routed experts)."""
    h, nh = cfg.hidden_size, cfg.num_heads
    bf16 = 2
    q = (h * cfg.q_lora_rank + cfg.q_lora_rank * nh * cfg.qk_head_dim // world) if cfg.q_lora_rank \
        else h * nh * cfg.qk_head_dim // world
    attn = (q + h * (cfg.kv_lora_rank + cfg.qk_rope_head_dim)
            + cfg.kv_lora_rank * nh * (cfg.qk_nope_head_dim + cfg.v_head_dim) // world
            + nh * cfg.v_head_dim * h // world) * bf16
    per_expert = 3 * h * cfg.moe_intermediate_size
    if cfg.quant:
        expert_bytes = per_expert // 2 + per_expert // cfg.quant.group_size * bf16
    else:
        expert_bytes = per_expert * bf16
    total = 0
    for i in range(cfg.num_layers):
        total += attn
        if cfg.is_moe_layer(i):
            total += cfg.n_routed_experts * h * bf16 + cfg.n_routed_experts * 4  # router + fp32 bias
            total += 3 * h * cfg.moe_intermediate_size * cfg.n_shared_experts * bf16 // world
            total += cfg.n_routed_experts * expert_bytes // world  # same share for TP and EP splits
        else:
            total += 3 * h * cfg.intermediate_size * bf16 // world
    total += 2 * cfg.vocab_size * h * bf16 // world  # embedding + lm head, vocab-parallel
    return total


def kv_bytes_per_token(cfg: TargetConfig) -> int:
    # NOTE: MLA has one latent head: every rank keeps the whole cache.
    return cfg.num_layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 2


@dataclass(frozen=True)
class MemoryPlan:
    cfg: TargetConfig
    world: int
    device_bytes: int
    context: int
    expert_parallel: bool = False

    @property
    def weights_per_rank(self) -> int:
        return weight_bytes(self.cfg, self.world, self.expert_parallel)

    def need_per_rank(self, world: int | None = None) -> int:
        w = weight_bytes(self.cfg, world or self.world, self.expert_parallel)
        return w + _RESERVE + kv_bytes_per_token(self.cfg) * self.context

    @property
    def fits(self) -> bool:
        return self.need_per_rank() <= self.device_bytes

    @property
    def min_ranks(self) -> int | None:
        return next((n for n in range(1, 257) if self.need_per_rank(n) <= self.device_bytes), None)

    def check(self) -> "MemoryPlan":
        if not self.fits:
            n = self.min_ranks
            hint = f" It needs at least {n} GPUs of this size." if n else ""
            raise DeviceError(
                f"the model needs {self.need_per_rank() / _GIB:.0f} GiB per GPU with --tp {self.world} "
                f"({self.weights_per_rank / _GIB:.0f} GiB of weights + a {self.context}-token cache + "
                f"{_RESERVE // _GIB} GiB reserve) but each GPU has {self.device_bytes / _GIB:.0f} GiB.{hint} "
                "Use more GPUs (--tp) or a smaller --context.")
        return self


def plan_memory(cfg: TargetConfig, world: int, device_bytes: int, context: int,
                expert_parallel: bool = False) -> MemoryPlan:
    return MemoryPlan(cfg, world, device_bytes, context, expert_parallel)
