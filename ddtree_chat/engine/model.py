"""Kimi K2 / DeepSeek-V3 target math: MLA with YaRN (interleaved rope), dense first layers,
noaux_tc MoE with a shared expert. Math only: loading, caching and scheduling live elsewhere.

Module and parameter names follow the checkpoint (minus its prefix), so loading is near-identity;
the routed experts are the exception (stacked into one ExpertWeights per layer)."""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from . import ops
from .config import TargetConfig
from .ops.moe import ExpertWeights
from .parallel import SINGLE, TPGroup


class LatentCache(Protocol):
    """What attention needs from the cache owner (kv_cache.KVCache)."""

    length: int  # committed entries; this forward's tokens are written right after them

    def destination(self, layer: int, t: int) -> tuple[torch.Tensor, torch.Tensor, int | torch.Tensor]:
        """The layer's full [S, r] / [S, p] buffers and where this forward's t entries go: the first of t
        consecutive slots, or device slot indices [t]."""
        ...


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return ops.rms_norm(x, self.weight, self.eps)

    def add(self, x, residual):
        """(self(x + residual), x + residual) in one pass."""
        return ops.add_rms_norm(x, residual, self.weight, self.eps)

    def linear(self, x, w):
        """F.linear(self(x), w), the norm inside the product where a kernel serves the shape."""
        return ops.rms_norm_linear(x, self.weight, self.eps, w)


class MLP(nn.Module):
    """SwiGLU MLP; under TP each rank holds inter/world of the intermediate features (partial sums out)."""

    def __init__(self, hidden: int, inter: int, tp: TPGroup = SINGLE, reduce: bool = False):
        super().__init__()
        local = inter // tp.world
        self.tp, self.reduce = tp, reduce and tp.world > 1
        self.gate_proj = ops.Linear(hidden, local, bias=False)
        self.up_proj = ops.Linear(hidden, local, bias=False)
        self.down_proj = ops.Linear(local, hidden, bias=False)

    def forward(self, x, residual=None):
        """residual: added to the output (inside the down product, unless a TP all-reduce comes first)."""
        h = ops.linear_glu(x, self.gate_proj.weight, self.up_proj.weight)
        if residual is not None and not self.reduce:
            return ops.linear_add(h, self.down_proj.weight, residual)
        y = self.down_proj(h)
        y = self.tp.all_reduce(y) if self.reduce else y
        return y if residual is None else residual + y


class VocabEmbedding(nn.Module):
    """Token embedding; under TP each rank holds a contiguous slice of the vocabulary."""

    def __init__(self, vocab: int, hidden: int, tp: TPGroup = SINGLE):
        super().__init__()
        self.tp = tp
        self.start, self.end = tp.split(vocab, "vocab_size")
        self.weight = nn.Parameter(torch.empty(self.end - self.start, hidden))

    def forward(self, ids):
        if self.tp.world == 1:
            return F.embedding(ids, self.weight)
        local = (ids >= self.start) & (ids < self.end)
        x = F.embedding((ids - self.start).clamp(0, self.end - self.start - 1), self.weight)
        return self.tp.all_reduce(x * local.unsqueeze(-1).to(x.dtype))


class MLA(nn.Module):
    def __init__(self, cfg: TargetConfig, layer: int, tp: TPGroup = SINGLE):
        super().__init__()
        self.layer, self.tp = layer, tp
        tp.split(cfg.num_heads, "num_attention_heads")
        self.h, self.dn, self.dr, self.dv = cfg.num_heads // tp.world, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.r = cfg.kv_lora_rank
        self.scale = cfg.softmax_scale
        hd = self.dn + self.dr
        if cfg.q_lora_rank:
            self.q_a_proj = ops.Linear(cfg.hidden_size, cfg.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
            self.q_b_proj = ops.Linear(cfg.q_lora_rank, self.h * hd, bias=False)
        else:
            self.q_proj = ops.Linear(cfg.hidden_size, self.h * hd, bias=False)
        self.kv_a_proj_with_mqa = ops.Linear(cfg.hidden_size, self.r + self.dr, bias=False)
        self.kv_a_layernorm = RMSNorm(self.r, cfg.rms_norm_eps)
        self.kv_b_proj = ops.Linear(self.r, self.h * (self.dn + self.dv), bias=False)
        self.o_proj = ops.Linear(self.h * self.dv, cfg.hidden_size, bias=False)
        self.register_buffer("qkv_a_weight", None, persistent=False)  # fuse_projections() sets it

    def fuse_projections(self) -> None:
        """q_a (or q) and kv_a both read x: one product over their stacked weights. The two parameters
        become views of it, so memory stays the same. For loaded (inference) weights."""
        if self.qkv_a_weight is None:
            first = self.q_a_proj if hasattr(self, "q_a_proj") else self.q_proj
            self.qkv_a_weight = ops.stack_weights(first, self.kv_a_proj_with_mqa)

    def _q_and_kv_a(self, x, in_norm: RMSNorm | None):
        """x [..., T, H] (in_norm(x) if given) -> q [..., T, h * 192], kv_a [..., T, r + p] (possibly
        slices of one product)."""
        lora = hasattr(self, "q_a_proj")
        if self.qkv_a_weight is None:
            x = in_norm(x) if in_norm is not None else x
            q, kv = (self.q_a_proj if lora else self.q_proj)(x), self.kv_a_proj_with_mqa(x)
        else:
            y = in_norm.linear(x, self.qkv_a_weight) if in_norm is not None else ops.linear(x, self.qkv_a_weight)
            q, kv = y.split([y.shape[-1] - self.r - self.dr, self.r + self.dr], -1)
        return (self.q_a_layernorm.linear(q, self.q_b_proj.weight) if lora else q), kv

    def forward(self, x, cos, sin, tree_mask, cache: LatentCache | None = None, in_norm: RMSNorm | None = None):
        """in_norm: the layer's input norm, applied here (inside the first product where a kernel can)."""
        q, kv = self._q_and_kv_a(x, in_norm)
        q = q.unflatten(-1, (self.h, self.dn + self.dr))  # [..., T, h, 192]
        q_nope, q_pe = q[..., : self.dn], ops.apply_rope_interleaved(q[..., self.dn :], cos, sin, heads=True)
        norm = self.kv_a_layernorm
        if cache is None:  # normed c_kv [..., T, r] and roped k_pe [..., T, p] of these tokens only
            prefix = 0
            ckv, kpe = norm(kv[..., : self.r]), ops.apply_rope_interleaved(kv[..., self.r :], cos, sin)
        else:
            prefix = cache.length
            ckv, kpe = ops.latent_write(kv, norm.weight, norm.eps, cos, sin,
                                        *cache.destination(self.layer, kv.shape[-2]))
        w = self.kv_b_proj.weight.view(self.h, self.dn + self.dv, self.r)
        w_uk, w_uv = w[:, : self.dn], w[:, self.dn :]  # [h, dn, r], [h, dv, r]
        # absorbed: queries in latent space, one product per head
        q_lat = ops.matmul_nt(q_nope.transpose(-3, -2), w_uk.transpose(-1, -2)).transpose(-3, -2)  # [..., T, h, r]
        o_lat = ops.mla_attention(q_lat, q_pe, ckv, kpe, prefix, tree_mask, self.scale)
        o = ops.matmul_nt(o_lat.transpose(-3, -2), w_uv).transpose(-3, -2)  # [..., T, h, dv]
        return self.tp.all_reduce(self.o_proj(o.flatten(-2)))  # NOTE: heads are split under TP


class MoE(nn.Module):
    def __init__(self, cfg: TargetConfig, tp: TPGroup = SINGLE):
        super().__init__()
        self.cfg, self.tp = cfg, tp
        # expert parallel: this rank owns experts [e0, e1); else every rank owns a slice of each expert
        self.e0, self.e1 = tp.split(cfg.n_routed_experts, "n_routed_experts") if tp.expert_parallel \
            else (0, cfg.n_routed_experts)
        self.gate = ops.Linear(cfg.hidden_size, cfg.n_routed_experts, bias=False)
        # NOTE: fp32 on disk and in memory; used for selection only.
        self.gate.register_buffer("e_score_correction_bias", torch.zeros(cfg.n_routed_experts, dtype=torch.float32))
        self.shared_experts = MLP(cfg.hidden_size, cfg.moe_intermediate_size * cfg.n_shared_experts, tp) \
            if cfg.n_shared_experts else None
        self.experts: ExpertWeights | None = None  # assigned by the loader

    def fuse_projections(self) -> None:
        """Dense experts on a GPU (small float32 models): the shared expert joins the routed ones as one
        more expert that every token takes at weight 1 (ExpertWeights.shared), so routed + shared is one
        GLU and one down product (ops.moe_experts_dense: 2 launches instead of 5). The shared MLP's
        parameters become views of the joined weights. The CPU path keeps them apart."""
        ex, sh = self.experts, self.shared_experts
        if ex is None or ex.shared or sh is None or not torch.is_tensor(ex.down) or not ex.down.is_cuda \
                or sh.gate_proj.weight.shape != ex.gate.shape[1:] or sh.gate_proj.weight.dtype != ex.gate.dtype:
            return
        gate = torch.cat([ex.gate, sh.gate_proj.weight.detach()[None]])  # [E + 1, I, H]
        up = torch.cat([ex.up, sh.up_proj.weight.detach()[None]])
        down = torch.cat([ex.down.permute(1, 0, 2), sh.down_proj.weight.detach()[:, None]], 1)  # [H, E + 1, I]
        e = ex.num_experts
        for lin, w in ((sh.gate_proj, gate[e]), (sh.up_proj, up[e]), (sh.down_proj, down[:, e])):
            lin.weight = nn.Parameter(w, requires_grad=False)
        self.experts = ExpertWeights(gate, up, down.permute(1, 0, 2), shared=1)

    def forward(self, x, residual=None):
        """residual: added to the output (inside the experts' last product when nothing comes after it)."""
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        c = self.cfg
        logits = ops.router_logits(x2, self.gate.weight)
        ids, w = ops.route(logits, self.gate.e_score_correction_bias, c.num_experts_per_tok,
                           c.routed_scaling_factor, c.n_group, c.topk_group, c.norm_topk_prob)
        if self.tp.expert_parallel and self.tp.world > 1:
            mine = (ids >= self.e0) & (ids < self.e1)
            ids, w = torch.where(mine, ids - self.e0, -1), w * mine  # NOTE: id -1 = on another rank
        separate = self.shared_experts is not None and not self.experts.shared
        inside = residual is not None and self.tp.world == 1 and not separate
        y = ops.moe_experts(x2, ids, w, self.experts, residual.reshape(x2.shape) if inside else None)
        if separate:  # NOTE: the routed sum is the shared expert's residual (added in its down product)
            y = self.shared_experts(x2, residual=y)
        y = self.tp.all_reduce(y).view(shape)  # one all-reduce for routed + shared partial sums
        return y if residual is None or inside else residual + y


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TargetConfig, layer: int, tp: TPGroup = SINGLE):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = MLA(cfg, layer, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MoE(cfg, tp) if cfg.is_moe_layer(layer) else MLP(cfg.hidden_size, cfg.intermediate_size, tp, reduce=True)

    def forward(self, x, cos, sin, tree_mask, cache=None):
        h, x = self.post_attention_layernorm.add(self.self_attn(x, cos, sin, tree_mask, cache, self.input_layernorm), x)
        return self.mlp(h, residual=x)


class KimiModel(ops.RopeOwner, nn.Module):
    """The text backbone. Parameter names: embed_tokens.*, layers.N.*, norm.*, lm_head.*."""

    def __init__(self, cfg: TargetConfig, tp: TPGroup = SINGLE):
        super().__init__()
        self.cfg, self.tp = cfg, tp
        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, tp) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = ops.Linear(cfg.hidden_size, cfg.vocab_size // tp.world, bias=False)  # vocab-parallel
        self.register_buffer("inv_freq", self._inv_freq(), persistent=False)
        self.rope_table = ops.RopeTable()  # Decoder reserves its positions

    def _inv_freq(self) -> torch.Tensor:
        return ops.yarn_inv_freq(self.cfg.qk_rope_head_dim, self.cfg.rope_theta, self.cfg.rope_scaling)

    def fuse_projections(self) -> None:
        """Every layer's q_a and kv_a products as one (MLA.fuse_projections); dense experts with their
        shared expert (MoE.fuse_projections)."""
        for layer in self.layers:
            layer.self_attn.fuse_projections()
            if isinstance(layer.mlp, MoE):
                layer.mlp.fuse_projections()

    def forward(self, tokens, positions, tree_mask, cache: LatentCache | None = None,
                feature_layers: tuple[int, ...] = ()):
        """tokens [..., T], positions [T], tree_mask [T, T] bool (row i sees column j).
        Returns the last hidden state [..., T, H] (before the final norm) and, concatenated on the last
        axis, the outputs of the layers in `feature_layers` (the drafter's inputs; [..., T,
        len(feature_layers) * H], or None)."""
        x = self.embed_tokens(tokens)
        cos, sin = self.rope(positions, x.dtype)
        feats = []
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, tree_mask, cache)
            if i in feature_layers:
                feats.append(x)
        if feature_layers:  # NOTE: in `feature_layers` order, a layer listed twice given twice
            held = sorted(set(feature_layers))
            feats = [feats[held.index(i)] for i in feature_layers]
        return x, (torch.cat(feats, dim=-1) if feats else None)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """lm_head over the whole vocabulary (gathered across TP ranks), float32."""
        return self.tp.all_gather_last(self.lm_head(x).float())

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """head(norm(hidden)), the norm inside the lm-head product where a kernel serves the shape."""
        return self.tp.all_gather_last(self.norm.linear(hidden, self.lm_head.weight).float())


def causal_mask(t: int, device=None) -> torch.Tensor:
    return torch.ones(t, t, dtype=torch.bool, device=device).tril()
