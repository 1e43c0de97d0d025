"""Bytes accounting: per-rank weights, the KV cache that fits, and what one forward must read."""

from __future__ import annotations

from dataclasses import dataclass

from .config import TargetConfig
from .errors import DeviceError

_GIB = 1024**3
_RESERVE = 4 * _GIB  # activations, CUDA context, graphs, the drafter's share


_BF16 = 2


def attention_bytes(cfg: TargetConfig, world: int = 1) -> int:
    """One layer's MLA projections (bf16) held by one of `world` head-parallel ranks."""
    h, nh = cfg.hidden_size, cfg.num_heads
    q = (h * cfg.q_lora_rank + cfg.q_lora_rank * nh * cfg.qk_head_dim // world) if cfg.q_lora_rank \
        else h * nh * cfg.qk_head_dim // world
    return (q + h * (cfg.kv_lora_rank + cfg.qk_rope_head_dim)
            + cfg.kv_lora_rank * nh * (cfg.qk_nope_head_dim + cfg.v_head_dim) // world
            + nh * cfg.v_head_dim * h // world) * _BF16


def expert_bytes(cfg: TargetConfig) -> int:
    """One routed expert (gate, up, down): INT4 nibbles + bf16 group scales, or bf16 when unquantised."""
    n = 3 * cfg.hidden_size * cfg.moe_intermediate_size
    return n // 2 + n // cfg.quant.group_size * _BF16 if cfg.quant else n * _BF16


def weight_bytes(cfg: TargetConfig, world: int = 1, expert_parallel: bool = False, elem: int = _BF16,
                 packed: bool = True) -> int:
    """Bytes of target weights one rank holds: dense parts at `elem` bytes a value (bf16), routed experts INT4 +
    bf16 scales (packed) or dequantised to `elem` bytes a value (the CPU's form)."""
    h = cfg.hidden_size
    expert = expert_bytes(cfg) if packed else 3 * h * cfg.moe_intermediate_size * elem
    total = 0
    for i in range(cfg.num_layers):
        total += attention_bytes(cfg, world) * elem // _BF16
        if cfg.is_moe_layer(i):
            total += cfg.n_routed_experts * h * elem + cfg.n_routed_experts * 4  # router + fp32 bias
            total += 3 * h * cfg.moe_intermediate_size * cfg.n_shared_experts * elem // world
            total += cfg.n_routed_experts * expert // world  # same share for TP and EP splits
        else:
            total += 3 * h * cfg.intermediate_size * elem // world
    total += 2 * cfg.vocab_size * h * elem // world  # embedding + lm head, vocab-parallel
    return total


def host_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes; None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_host_memory(cfg: TargetConfig, world: int, elem: int, available: int | None) -> None:
    """A CPU load holds every rank's weights in this host's memory, routed experts dequantised (the CPU has no
    INT4 kernel): one clear error before loading what would end in the kernel's out-of-memory kill."""
    need = world * weight_bytes(cfg, world, elem=elem, packed=False)
    if available is not None and need > available:
        raise DeviceError(
            f"the model needs ~{need / _GIB:.0f} GiB of host memory on the CPU (its experts dequantised to "
            f"{8 * elem}-bit values) but {available / _GIB:.0f} GiB are available. Run it on GPUs "
            "(--device cuda) or on a machine with more memory.")


def kv_bytes_per_token(cfg: TargetConfig) -> int:
    # NOTE: MLA has one latent head: every rank keeps the whole cache.
    return cfg.num_layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * _BF16


def forward_bytes(cfg: TargetConfig, tokens: int, context: int, world: int = 1) -> dict[str, float]:
    """Bytes one target forward over `tokens` new tokens must read (bf16 dense, INT4 experts with bf16
    scales), with the expected distinct experts touched under uniform routing (1 - (1 - k/E)^T of E per layer).
    world: what one of that many tensor-parallel ranks reads (its heads, 1/world of every matrix split
    under TP and of each touched expert; the router and the latent cache whole)."""
    h, bf16 = cfg.hidden_size, _BF16
    e, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    touched = e * (1 - (1 - 1 / e) ** (k * tokens)) if e else 0.0
    moe_layers = sum(cfg.is_moe_layer(i) for i in range(cfg.num_layers))
    out = {
        "attention": attention_bytes(cfg, world) * cfg.num_layers,
        "dense_mlp": 3 * h * cfg.intermediate_size * bf16 * (cfg.num_layers - moe_layers) / world,
        "shared_experts": 3 * h * cfg.moe_intermediate_size * cfg.n_shared_experts * bf16 * moe_layers / world,
        "router": e * h * bf16 * moe_layers,
        "routed_experts": touched * expert_bytes(cfg) * moe_layers / world,
        "lm_head": cfg.vocab_size * h * bf16 / world,
        "kv_cache": (context + tokens) * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * bf16 * cfg.num_layers,
    }
    out["total"] = sum(out.values())
    out["experts_touched_per_layer"] = touched
    return out


def layer_bytes(cfg: TargetConfig, layer: int, tokens: int, context: int) -> float:
    """What one decoder layer of forward_bytes reads: its attention weights and latent cache, then its
    MLP (dense, or router + shared + the distinct routed experts touched)."""
    parts = forward_bytes(cfg, tokens, context)
    moe_layers = sum(cfg.is_moe_layer(i) for i in range(cfg.num_layers))
    dense_layers = cfg.num_layers - moe_layers
    own = (parts["attention"] + parts["kv_cache"]) / cfg.num_layers
    if cfg.is_moe_layer(layer):
        return own + (parts["shared_experts"] + parts["router"] + parts["routed_experts"]) / moe_layers
    return own + parts["dense_mlp"] / dense_layers


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
