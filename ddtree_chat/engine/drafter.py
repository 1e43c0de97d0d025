"""DFlash block-diffusion drafter math (Qwen3-style GQA, half-split rope; docs/architecture.md, the drafter).

It has no embedding or lm head: callers embed the block with the target's embed_tokens and apply the
target's lm_head to `norm(hidden)`. Context = target layer features -> fc -> hidden_norm, projected by
every layer's k_proj/v_proj (+ k_norm, + rope at absolute positions). Context tokens are never queries.

Under tensor parallelism each rank holds 1/N of the heads (query and key/value), of the MLP features and of
fc's input features; o_proj, down_proj and fc end in an all-reduce, like the target's."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import ops
from .config import DraftConfig
from .model import MLP, RMSNorm
from .parallel import SINGLE, TPGroup


class DraftAttention(nn.Module):
    def __init__(self, cfg: DraftConfig, tp: TPGroup = SINGLE):
        super().__init__()
        tp.split(cfg.num_heads, "the drafter's num_attention_heads")
        tp.split(cfg.num_kv_heads, "the drafter's num_key_value_heads")
        self.tp = tp
        self.nh, self.nkv, self.d = cfg.num_heads // tp.world, cfg.num_kv_heads // tp.world, cfg.head_dim
        self.q_proj = ops.Linear(cfg.hidden_size, self.nh * self.d, bias=False)
        self.k_proj = ops.Linear(cfg.hidden_size, self.nkv * self.d, bias=False)
        self.v_proj = ops.Linear(cfg.hidden_size, self.nkv * self.d, bias=False)
        self.o_proj = ops.Linear(self.nh * self.d, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps)
        self.register_buffer("qkv_weight", None, persistent=False)  # fuse_projections() sets these two
        self.register_buffer("qk_norm_weight", None, persistent=False)

    def fuse_projections(self) -> None:
        """One product for the block's q, k and v; the three parameters become views of it. For loaded
        (inference) weights. q_norm and k_norm as one per-head weight [nh + nkv, d]: the block's q and k
        heads are normed and roped in one launch."""
        if self.qkv_weight is None:
            self.qkv_weight = ops.stack_weights(self.q_proj, self.k_proj, self.v_proj)
        if self.qk_norm_weight is None:  # NOTE: q_norm and k_norm share cfg.rms_norm_eps
            self.qk_norm_weight = torch.cat([self.q_norm.weight.detach().expand(self.nh, self.d),
                                             self.k_norm.weight.detach().expand(self.nkv, self.d)])

    def _roped(self, k, v, cos, sin):
        k = ops.rms_norm_rope_half(k.unflatten(-1, (self.nkv, self.d)), self.k_norm.weight, self.k_norm.eps, cos, sin)
        return k, v.unflatten(-1, (self.nkv, self.d))

    def kv(self, x, cos, sin):
        """x [..., n, H] -> roped k, v [..., n, kv_heads, d] (cacheable for context entries; a fused
        drafter computes every layer's at once: DFlashDrafter.context_kv_stacked)."""
        return self._roped(self.k_proj(x), self.v_proj(x), cos, sin)

    def forward(self, x, cos, sin, k_ctx, v_ctx, mask=None):
        """x [..., B, H] (normed block states); k_ctx/v_ctx [..., n, kv, d]; mask [B, n + B] bool or None
        (None: everything visible — context fully, the block bidirectionally), an integer tensor [1] (the
        first that many context entries visible, as ops.draft_attention), or [..., 1, B, n + B] for
        batched rows."""
        if self.qk_norm_weight is not None:  # the fused product's q and k heads: [..., B, nh + nkv, d], normed at once
            qk, v = ops.linear(x, self.qkv_weight).split([(self.nh + self.nkv) * self.d, self.nkv * self.d], -1)
            qk = ops.rms_norm_rope_half(qk.unflatten(-1, (self.nh + self.nkv, self.d)), self.qk_norm_weight,
                                        self.q_norm.eps, cos, sin)
            q, k_blk, v_blk = qk[..., : self.nh, :], qk[..., self.nh :, :], v.unflatten(-1, (self.nkv, self.d))
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            q = ops.rms_norm_rope_half(q.unflatten(-1, (self.nh, self.d)), self.q_norm.weight, self.q_norm.eps, cos, sin)
            k_blk, v_blk = self._roped(k, v, cos, sin)
        if mask is not None and mask.dim() > 2:  # batched rows with their own masks (training): SDPA
            k = torch.cat([k_ctx, k_blk], dim=-3).transpose(-3, -2)  # [..., kv, n + B, d]
            v = torch.cat([v_ctx, v_blk], dim=-3).transpose(-3, -2)
            rep = self.nh // self.nkv
            k, v = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
            o = F.scaled_dot_product_attention(q.transpose(-3, -2), k, v, attn_mask=mask)
            return self.tp.all_reduce(self.o_proj(o.transpose(-3, -2).flatten(-2)))
        # NOTE: one block over a cached context (the engine)
        o = ops.draft_attention(q, k_ctx, v_ctx, k_blk, v_blk, mask, self.d**-0.5)
        return self.tp.all_reduce(self.o_proj(o.flatten(-2)))


class DraftLayer(nn.Module):
    def __init__(self, cfg: DraftConfig, tp: TPGroup = SINGLE):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, tp, reduce=True)

    def forward(self, x, cos, sin, k_ctx, v_ctx, mask=None, pending=None):
        """-> (mlp_out, x): the layer's output is x + mlp_out, left for the next norm to add (one launch).
        pending: the previous layer's mlp_out (None: x is complete)."""
        h, x = (self.input_layernorm(x), x) if pending is None else self.input_layernorm.add(pending, x)
        h, x = self.post_attention_layernorm.add(self.self_attn(h, cos, sin, k_ctx, v_ctx, mask), x)
        return self.mlp(h), x


class DFlashDrafter(ops.RopeOwner, nn.Module):
    def __init__(self, cfg: DraftConfig, tp: TPGroup = SINGLE):
        super().__init__()
        self.cfg, self.tp = cfg, tp
        self.kv_heads = cfg.num_kv_heads // tp.world  # this rank's share (its context cache holds only these)
        self.features = tp.split(len(cfg.target_layer_ids) * cfg.hidden_size, "the drafter's fc input")
        self.fc = ops.Linear(self.features[1] - self.features[0], cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(cfg, tp) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.register_buffer("inv_freq", self._inv_freq(), persistent=False)
        self.rope_table = ops.RopeTable()  # Decoder reserves its positions
        self.register_buffer("ctx_kv_weight", None, persistent=False)  # fuse_projections() sets these two
        self.register_buffer("ctx_k_norm_weight", None, persistent=False)

    def _inv_freq(self):
        return ops.yarn_inv_freq(self.cfg.head_dim, self.cfg.rope_theta, self.cfg.rope_scaling)

    def fuse_projections(self) -> None:
        """Every layer's q, k and v products as one (DraftAttention.fuse_projections), and the context's
        k and v of all layers as one product, normed and roped in one launch: every k row, then every v
        row (a copy of those weights: 2 kv / (nh + 2 kv) of the attention's), and the k norms as one
        per-head weight [L * kv, d]."""
        attn = [layer.self_attn for layer in self.layers]
        for a in attn:
            a.fuse_projections()
        if self.ctx_kv_weight is None:
            self.ctx_kv_weight = torch.cat([a.k_proj.weight for a in attn] + [a.v_proj.weight for a in attn]).detach()
            self.ctx_k_norm_weight = torch.cat([a.k_norm.weight.detach().expand(a.nkv, a.d) for a in attn])

    def _context(self, feats: torch.Tensor, positions: torch.Tensor):
        if self.tp.world > 1:  # NOTE: fc's input features are split over the ranks: partial sums
            feats = self.tp.all_reduce(self.fc(feats[..., self.features[0] : self.features[1]]))
        else:
            feats = self.fc(feats)
        ctx = self.hidden_norm(feats)
        return (ctx, *self.rope(positions, ctx.dtype))

    def context_kv_stacked(self, feats: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """feats [..., n, len(ids) * H] target features at `positions` [n] -> every layer's k, v
        [..., n, L, kv, d]."""
        if self.ctx_kv_weight is None:
            per = self.context_kv(feats, positions)
            return torch.stack([k for k, _ in per], -3), torch.stack([v for _, v in per], -3)
        ctx, cos, sin = self._context(feats, positions)
        layers, kv, d = len(self.layers), self.kv_heads, self.cfg.head_dim
        k, v = ops.linear(ctx, self.ctx_kv_weight).unflatten(-1, (2, layers * kv, d)).unbind(-3)
        k = ops.rms_norm_rope_half(k, self.ctx_k_norm_weight, self.cfg.rms_norm_eps, cos, sin)
        return k.unflatten(-2, (layers, kv)), v.unflatten(-2, (layers, kv))

    def context_kv(self, feats: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """context_kv_stacked as per layer (k, v) [..., n, kv, d] (unfused, as training runs it: layer by
        layer, nothing stacked)."""
        if self.ctx_kv_weight is not None:
            k, v = self.context_kv_stacked(feats, positions)
            return list(zip(k.unbind(-3), v.unbind(-3)))
        ctx, cos, sin = self._context(feats, positions)
        return [layer.self_attn.kv(ctx, cos, sin) for layer in self.layers]

    def forward(self, block_emb: torch.Tensor, positions: torch.Tensor,
                ctx_kv: list[tuple[torch.Tensor, torch.Tensor]], mask=None) -> torch.Tensor:
        """block_emb [..., B, H] at `positions` [B] -> normed hidden [..., B, H] (apply the target lm_head)."""
        cos, sin = self.rope(positions, block_emb.dtype)
        return self.hidden(block_emb, cos, sin, ctx_kv, mask)

    def hidden(self, x, cos, sin, ctx_kv, mask=None) -> torch.Tensor:
        """The layers and the final norm over block states x [..., B, H] with their rope cos/sin (the
        training forward passes its own per-row positions)."""
        pending = None
        for layer, (k, v) in zip(self.layers, ctx_kv):
            pending, x = layer(x, cos, sin, k, v, mask, pending)
        return self.norm.add(pending, x)[0]
