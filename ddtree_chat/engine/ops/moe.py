"""Routed experts: y[t] = sum_k w[t,k] * down(silu(gate(x[t])) * up(x[t]))[ids[t,k]]."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from . import cpu_exact, cpu_packed
from .int4 import Int4Weight
from .linear import linear, linear_add, matmul_nt_ref, routed_glu, routing_matrix, silu
from .registry import define


@dataclass
class ExpertWeights:
    """gate/up [E, I, H] and down [E, H, I]: dense tensors or packed INT4. The last `shared` experts are
    shared experts folded in (dense only, MoE.fuse_projections): every token takes them at weight 1."""

    gate: torch.Tensor | Int4Weight
    up: torch.Tensor | Int4Weight
    down: torch.Tensor | Int4Weight
    shared: int = 0
    stacked: tuple | None = field(default=None, repr=False, compare=False)  # _stacked_cpu's, built on first use

    @property
    def num_experts(self) -> int:
        return self.gate.shape[0]

    def matrix(self, which: str, expert: int, dtype) -> torch.Tensor:
        w = getattr(self, which)
        return w.dequant(expert, dtype) if isinstance(w, Int4Weight) else w[expert]


def moe_experts_ref(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, experts: ExpertWeights) -> torch.Tensor:
    """x [T, H], ids/weights [T, k] -> [T, H]. Each touched expert is read once for all its tokens (on the CPU from
    DENSE_ROWS rows on, every expert). NOTE: id -1 marks an expert held by another rank (expert parallel): skipped."""
    out = torch.zeros(x.shape[0], experts.down.shape[1], dtype=torch.float32, device=x.device)
    stacked = _stacked_cpu(experts) if x.shape[0] >= DENSE_ROWS and not cpu_exact.enabled(x) else None
    if stacked is not None:
        _routed_dense_cpu(out, x, ids, weights, stacked)
    elif torch.is_tensor(experts.gate) and x.device.type == "cpu" and hasattr(F, "grouped_mm"):
        _routed_grouped_mm(out, x, ids, weights, experts)
    else:
        _routed_per_expert(out, x, ids, weights, experts)
    for e in range(experts.num_experts - experts.shared, experts.num_experts):
        out += _expert(x, experts, e).float()
    return out.to(x.dtype)


def _pairs_by_expert(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the (token, slot) pairs' flat indexes grouped by expert, in token order within an expert; their experts).
    NOTE: ids of -1 (another rank's experts) sort first and are left out."""
    flat = ids.flatten()
    order = flat.argsort(stable=True)[int((flat < 0).sum()) :]
    return order, flat[order]


def _routed_per_expert(out: torch.Tensor, x, ids, weights, experts: ExpertWeights) -> None:
    """out [T, H] float32 += the routed experts' weighted outputs, one set of products per touched expert."""
    order, expert_of = _pairs_by_expert(ids)
    counts = torch.bincount(expert_of, minlength=experts.num_experts).tolist()
    tok_all = order // ids.shape[1]
    w_all = weights.flatten()[order].float()
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        tok = tok_all[start : start + n]
        xe = x[tok]
        out.index_add_(0, tok, _expert(xe, experts, e).float() * w_all[start : start + n, None])
        start += n


def _routed_grouped_mm(out: torch.Tensor, x, ids, weights, experts: ExpertWeights) -> None:
    """_routed_per_expert for dense experts on the CPU: each of gate, up and down as one grouped product over
    the (token, expert) pairs sorted by expert. The same products per expert, in ~10 calls instead of ~10 per
    touched expert (a verify touches most experts: the calls, not the arithmetic, cost there)."""
    n_routed = experts.num_experts - experts.shared
    order, expert_of = _pairs_by_expert(ids)
    if order.numel() == 0:
        return
    counts = torch.bincount(expert_of, minlength=n_routed)
    tok = order // ids.shape[1]
    gate, up, down = (w[:n_routed].transpose(1, 2) for w in (experts.gate, experts.up, experts.down))
    if cpu_exact.enabled(x):  # NOTE: each expert's rows padded to a multiple of 4 (cpu_exact.grouped_rows)
        dest, offs = cpu_exact.grouped_rows(counts, expert_of)
        xs = x.new_zeros(int(offs[-1]), x.shape[1]).index_copy_(0, dest, x[tok])
    else:
        dest, offs, xs = None, counts.cumsum(0).to(torch.int32), x[tok]  # offs: each expert's rows end
    h = silu(F.grouped_mm(xs, gate, offs=offs)) * F.grouped_mm(xs, up, offs=offs)
    y = F.grouped_mm(h, down, offs=offs)
    out.index_add_(0, tok, (y if dest is None else y[dest]).float() * weights.flatten()[order, None].float())


DENSE_ROWS = 4  # a CPU call of this many rows or more runs every routed expert densely (_routed_dense_cpu)


def _stacked_cpu(experts: ExpertWeights) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int] | None:
    """The routed experts of dense CPU weights as three products' weights, flagged for packing (ops/cpu_packed.py):
    gate, up [E * I, H], down [H, E * I] (views where prepare_experts laid down out [H, E, I], else a copy, rebuilt
    after an in-place write) and E, the routed experts; None where the weights are not dense CPU ones or are not
    packed (DDTREE_CPU_PACK=0): every expert on every row pays only through the packed products."""
    d = experts.down
    if not (torch.is_tensor(d) and d.device.type == "cpu" and d.dim() == 3 and cpu_packed.available(d.dtype)):
        return None
    held = experts.stacked
    if held is None or held[0] != d._version:
        e, h, i = d.shape
        n = e - experts.shared
        g, u = (w[:n].reshape(n * i, h) for w in (experts.gate, experts.up))
        down = d[:n].permute(1, 0, 2).reshape(h, n * i).contiguous()
        ok = all([cpu_packed.mark_tensor(w) for w in (g, u, down)])
        held = experts.stacked = (d._version, (g, u, down, n) if ok else None)
    return held[1]


def _routed_dense_cpu(out: torch.Tensor, x, ids, weights, stacked) -> None:
    """out [T, H] float32 += the routed experts' weighted outputs, every expert on every row: gate and up one
    product each over all E experts, each expert's GLU scaled by the row's routing weight (0 unless routed; id -1,
    another rank's expert, matches none), and down with the top-k sum one product over the concatenated [T, E * I]
    intermediates. It reads every expert once for all rows: on the CPU faster than the grouped products from a
    few rows on (a verify touches most experts), slower below (BENCHMARKS.md, "CPU figures")."""
    g, u, down, n = stacked
    t = x.shape[0]
    scale = routing_matrix(ids, weights, n).to(x.dtype)
    h = silu(cpu_packed.linear(x, g)) * cpu_packed.linear(x, u)  # [T, E * I]
    out += cpu_packed.linear((h.view(t, n, -1) * scale[:, :, None]).view(t, -1), down).float()


def _expert(x: torch.Tensor, experts: ExpertWeights, e: int) -> torch.Tensor:
    h = silu(matmul_nt_ref(x, experts.matrix("gate", e, x.dtype))) * matmul_nt_ref(x, experts.matrix("up", e, x.dtype))
    return matmul_nt_ref(h, experts.matrix("down", e, x.dtype))


def moe_experts_dense(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, experts: ExpertWeights,
                      residual: torch.Tensor | None = None) -> torch.Tensor:
    """moe_experts_ref without host synchronisation (so a CUDA graph can capture it): every expert runs on
    every token, its GLU output scaled by the token's routing weight (0 unless routed), and the down
    products plus the top-k sum are one product over the experts' concatenated intermediates:
    [T, E * I] x [H, E * I]^T (residual [T, H]: added in that product). Dense weights only; worth it for
    few, small experts."""
    e, hidden, inter = experts.down.shape
    h = routed_glu(x, experts.gate, experts.up, ids, weights, experts.shared).reshape(x.shape[0], e * inter)
    down = experts.down.permute(1, 0, 2).reshape(hidden, e * inter)  # NOTE: a view once prepare_experts laid it out
    return (linear(h, down) if residual is None else linear_add(h, down, residual)).to(x.dtype)


def _moe_reference(x, ids, weights, experts: ExpertWeights, residual: torch.Tensor | None = None) -> torch.Tensor:
    y = moe_experts_ref(x, ids, weights, experts)
    return y if residual is None else residual + y


def _dense_experts(x, ids, weights, experts: ExpertWeights, residual: torch.Tensor | None = None) -> torch.Tensor:
    return moe_experts_dense(x, ids, weights, experts, residual)


MOE_EXPERTS = define("moe_experts", _moe_reference)
# NOTE: dense experts on a GPU belong to small float32 models (engine.default_dtype): few experts, and a CUDA
# graph cannot capture the grouped form's host sync. Builtin: it stays with the kernels off.
MOE_EXPERTS.register(_dense_experts, supports=lambda x, ids, w, experts, residual: torch.is_tensor(experts.down),
                     builtin=True)


def moe_experts(x, ids, weights, experts: ExpertWeights, residual: torch.Tensor | None = None):
    """residual [T, H] or None: added to the output (inside the last product where one serves)."""
    return MOE_EXPERTS(x, ids, weights, experts, residual)


def _prepare_reference(experts: ExpertWeights) -> ExpertWeights:
    return experts


PREPARE_EXPERTS = define("prepare_experts", _prepare_reference)


def prepare_experts(experts: ExpertWeights) -> ExpertWeights:
    """Load-time hook: a registered kernel may repack the experts into its own layout. Dense experts keep
    their values with down stored [H, E, I] underneath (moe_experts_dense reads it as one [H, E * I]
    matrix without a copy)."""
    if torch.is_tensor(experts.down):
        down = experts.down.permute(1, 0, 2).contiguous().permute(1, 0, 2)
        return ExpertWeights(experts.gate, experts.up, down, experts.shared)
    return PREPARE_EXPERTS.on(experts.down.scale, experts)  # NOTE: the scales carry the model's dtype
