"""Training-time pieces for the target: trainable routed experts, a dense-compute MoE forward with
optional INT4 fake quantisation (QAT, straight-through), expert-load tracking for the DeepSeek-V3
bias-update balancing rule, an SDPA attention for causal training forwards, and the INT4 export math."""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

from ddtree_chat.engine import ops
from ddtree_chat.engine.model import KimiModel, MoE
from ddtree_chat.engine.ops.int4 import pack_int4
from ddtree_chat.engine.ops.moe import ExpertWeights

GROUP = 32


def int4_codes(w: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric RTN with the scale rounded to bf16 first (it is stored as bf16): codes [.., out, in], scale bf16."""
    g = w.float().unflatten(-1, (w.shape[-1] // group, group))
    scale = (g.abs().amax(-1) / 7.0).clamp_min(1e-8).to(torch.bfloat16)
    q = torch.round(g / scale.float().unsqueeze(-1)).clamp(-8, 7)
    return q.flatten(-2), scale


def fake_quant(w: torch.Tensor) -> torch.Tensor:
    q, scale = int4_codes(w.detach())
    wq = (q.unflatten(-1, (-1, GROUP)) * scale.float().unsqueeze(-1)).flatten(-2).to(w.dtype)
    return w + (wq - w).detach()  # straight-through estimator


def export_int4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q, scale = int4_codes(w)
    return pack_int4(q.to(torch.int8)), scale


def _moe_train_forward(self: MoE, x, residual=None):
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    c = self.cfg
    with torch.autocast(x.device.type, enabled=False):
        logits = F.linear(x2.float(), self.gate.weight.float())
        ids, w = ops.route(logits, self.gate.e_score_correction_bias, c.num_experts_per_tok,
                           c.routed_scaling_factor, c.n_group, c.topk_group, c.norm_topk_prob)
    self._load = torch.bincount(ids.flatten(), minlength=c.n_routed_experts).detach()
    e, i, h = self.experts.gate.shape
    g, u, d = self.experts.gate, self.experts.up, self.experts.down
    if getattr(self, "_qat", False):
        g, u, d = fake_quant(g), fake_quant(u), fake_quant(d)
    dense_w = torch.zeros(x2.shape[0], e, device=x.device, dtype=w.dtype).scatter(1, ids, w)
    hg = x2 @ g.reshape(e * i, h).T
    hu = x2 @ u.reshape(e * i, h).T
    act = (F.silu(hg) * hu).view(-1, e, i) * dense_w.to(hg.dtype).unsqueeze(-1)
    y = act.reshape(-1, e * i) @ d.permute(1, 0, 2).reshape(h, e * i).T
    if self.shared_experts is not None:
        y = y + self.shared_experts(x2)
    return y.view(shape) if residual is None else residual + y.view(shape)


class TrainTarget(nn.Module):
    """KimiModel + its routed experts as registered parameters (experts.L.{gate,up,down})."""

    def __init__(self, cfg, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.model = KimiModel(cfg)
        self.experts = nn.ModuleDict()
        hdim, inter, n = cfg.hidden_size, cfg.moe_intermediate_size, cfg.n_routed_experts
        for li, layer in enumerate(self.model.layers):
            if isinstance(layer.mlp, MoE):
                p = nn.ParameterDict({
                    "gate": nn.Parameter(torch.randn(n, inter, hdim) / hdim ** 0.5),
                    "up": nn.Parameter(torch.randn(n, inter, hdim) / hdim ** 0.5),
                    "down": nn.Parameter(torch.randn(n, hdim, inter) / inter ** 0.5)})
                self.experts[str(li)] = p
                layer.mlp.experts = ExpertWeights(p["gate"], p["up"], p["down"])
                layer.mlp.forward = types.MethodType(_moe_train_forward, layer.mlp)
                nn.init.normal_(layer.mlp.gate.weight, std=0.02)
        nn.init.normal_(self.model.embed_tokens.weight, std=1.0)
        nn.init.normal_(self.model.lm_head.weight, std=hdim ** -0.5)

    def moe_layers(self):
        return [l.mlp for l in self.model.layers if isinstance(l.mlp, MoE)]

    def set_qat(self, on: bool) -> None:
        for m in self.moe_layers():
            m._qat = on

    @torch.no_grad()
    def update_bias(self, rate: float) -> list[float]:
        """DeepSeek-V3 auxiliary-loss-free balancing: raise the bias of under-loaded experts, lower the rest.
        Returns each layer's max/mean load ratio."""
        out = []
        for m in self.moe_layers():
            load = m._load.float()
            m.gate.e_score_correction_bias += rate * torch.sign(load.mean() - load)
            out.append(float(load.max() / load.mean().clamp_min(1)))
        return out

    def forward(self, tokens):
        t = tokens.shape[-1]
        pos = torch.arange(t, device=tokens.device)
        mask = torch.ones(t, t, dtype=torch.bool, device=tokens.device).tril()
        hidden, _ = self.model(tokens, pos, mask)
        return hidden


_CAUSAL_TRAINING = {"on": False}


def _sdpa_mla(q_lat, q_pe, ckv, kpe, prefix_len, tree_mask, scale):
    """Causal, cache-free forwards (training / scoring only): the absorbed MLA as one-KV-head SDPA."""
    if not _CAUSAL_TRAINING["on"] or prefix_len != 0:
        return ops.mla_attention_ref(q_lat, q_pe, ckv, kpe, prefix_len, tree_mask, scale)
    q = torch.cat([q_lat, q_pe], -1).transpose(-3, -2)  # [B, h, T, r+p]
    k = torch.cat([ckv, kpe], -1).unsqueeze(-3).expand(*q.shape[:-3], q.shape[-3], *ckv.shape[-2:-1],
                                                       q.shape[-1])
    v = ckv.unsqueeze(-3).expand(*q.shape[:-3], q.shape[-3], *ckv.shape[-2:])
    o = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), is_causal=True, scale=scale)
    return o.transpose(-3, -2)


def enable_sdpa_training(on: bool = True) -> None:
    from ddtree_chat.engine.ops import registry

    _CAUSAL_TRAINING["on"] = on
    registry.register("mla_attention", _sdpa_mla)
