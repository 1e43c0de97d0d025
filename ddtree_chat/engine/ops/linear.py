"""Products with a weight stored [N, K] (nn.Linear's layout): y = x @ w^T, plain or batched."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import cpu_exact, cpu_packed
from .norm import rms_norm
from .registry import define


def _matmul_nt(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.matmul(x, w.transpose(-1, -2))


def matmul_nt_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [..., M, K], w [..., N, K] (batch dims broadcast) -> [..., M, N]."""
    if cpu_exact.enabled(x):
        return cpu_exact.padded_rows(_matmul_nt, x, w)
    if cpu_packed.packable(w):  # NOTE: a CPU model's 2-D weight (ops/cpu_packed.py)
        return cpu_packed.linear(x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], w.shape[0])
    return _matmul_nt(x, w)


def silu(x: torch.Tensor) -> torch.Tensor:
    return cpu_exact.whole_blocks(F.silu, x) if cpu_exact.enabled(x) else F.silu(x)


def matmul_nt_glu_ref(x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor) -> torch.Tensor:
    """silu(x @ wg^T) * (x @ wu^T): a SwiGLU MLP's gate/up half (shapes as matmul_nt_ref)."""
    return silu(matmul_nt_ref(x, wg)) * matmul_nt_ref(x, wu)


MATMUL_NT = define("matmul_nt", matmul_nt_ref)
MATMUL_NT_GLU = define("matmul_nt_glu", matmul_nt_glu_ref)


def matmul_nt(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return MATMUL_NT(x, w)


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """F.linear without bias: x [..., K], w [N, K] -> [..., N]."""
    x2 = x.reshape(-1, x.shape[-1])
    return MATMUL_NT.run(linear_ref, x2, (x2, w)).view(*x.shape[:-1], w.shape[0])


def linear_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [M, K], w [N, K]: F.linear, its rows padded on the CPU (cpu_exact), or w's packed form (cpu_packed)."""
    return cpu_exact.padded_rows(F.linear, x, w) if cpu_exact.enabled(x) else cpu_packed.linear(x, w)


def linear_add_ref(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """residual + F.linear(x, w): x [..., K], w [N, K], residual [..., N] (a layer's last product and the
    residual stream's add)."""
    return residual + linear(x, w)


LINEAR_ADD = define("linear_add", linear_add_ref)


def linear_add(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """linear_add_ref in one launch where a kernel serves it (the add in the product's store)."""
    x2, r2 = x.reshape(-1, x.shape[-1]), residual.reshape(-1, w.shape[0])
    return LINEAR_ADD(x2, w, r2).view(residual.shape)


def rms_norm_linear_ref(x: torch.Tensor, norm_w: torch.Tensor, eps: float, w: torch.Tensor) -> torch.Tensor:
    """F.linear(rms_norm(x), w): x [..., K], norm_w [K], w [N, K] -> [..., N] (each op dispatched alone)."""
    return linear(rms_norm(x, norm_w, eps), w)


RMS_NORM_LINEAR = define("rms_norm_linear", rms_norm_linear_ref)


def rms_norm_linear(x: torch.Tensor, norm_w: torch.Tensor, eps: float, w: torch.Tensor) -> torch.Tensor:
    """An RMSNorm and the one product that reads it: one launch where a kernel serves the shape."""
    return RMS_NORM_LINEAR(x, norm_w, eps, w)


def matmul_nt_glu(x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor) -> torch.Tensor:
    return MATMUL_NT_GLU(x, wg, wu)


def routed_glu_ref(x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor, ids: torch.Tensor,
                   weights: torch.Tensor, shared: int = 0) -> torch.Tensor:
    """Every expert's GLU half on every token, scaled by the token's routing weight for that expert (0 if
    not routed to it; id -1, another rank's expert, matches none; the last `shared` experts: 1 for every
    token): x [T, K], wg/wu [E, I, K], ids/weights [T, k] -> [T, E, I]."""
    dense = routing_matrix(ids, weights, wg.shape[0], shared)
    return matmul_nt_glu(x, wg, wu).transpose(0, 1) * dense[:, :, None].to(x.dtype)


def routing_matrix(ids: torch.Tensor, weights: torch.Tensor, experts: int, shared: int = 0) -> torch.Tensor:
    """ids/weights [T, k] -> [T, experts] float32: each row's routing weight per expert (0 if not routed to it;
    id -1, another rank's expert, matches none; the last `shared` experts: 1 for every row)."""
    dense = torch.zeros(ids.shape[0], experts + 1, dtype=torch.float32, device=ids.device)
    dense.scatter_add_(1, ids.long() + 1, weights.float())  # column 0: other ranks' ids
    dense[:, experts + 1 - shared :] = 1.0
    return dense[:, 1:]


ROUTED_GLU = define("routed_glu", routed_glu_ref)


def routed_glu(x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor, ids: torch.Tensor,
               weights: torch.Tensor, shared: int = 0) -> torch.Tensor:
    return ROUTED_GLU(x, wg, wu, ids, weights, shared)


def linear_glu(x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor) -> torch.Tensor:
    """silu(F.linear(x, wg)) * F.linear(x, wu): x [..., K], wg/wu [N, K] -> [..., N]."""
    x2 = x.reshape(-1, x.shape[-1])
    return matmul_nt_glu(x2, wg, wu).view(*x.shape[:-1], wg.shape[0])


def stack_weights(*layers: nn.Linear) -> torch.Tensor:
    """The weights of bias-free Linears that read the same input, stacked into one [sum N, K] tensor for
    one product instead of len(layers); each layer's parameter becomes a view of it (no extra memory).
    NOTE: for inference weights (the views are leaves without gradients)."""
    w = torch.cat([layer.weight for layer in layers])
    for layer, part in zip(layers, w.split([layer.weight.shape[0] for layer in layers])):
        layer.weight = nn.Parameter(part, requires_grad=False)
    return w


class Linear(nn.Linear):
    """nn.Linear (same parameters, same state-dict names) whose product goes through ops.linear."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = linear(x, self.weight)
        return y if self.bias is None else y + self.bias
