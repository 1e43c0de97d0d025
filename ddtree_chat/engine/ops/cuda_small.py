"""Launchers for csrc/small_ops.cu: router top-k and RMSNorm (+ residual). Unsupported cases use the references."""

from __future__ import annotations

import torch

from .layout import row_layout
from .norm import add_rms_norm_ref, rms_norm_ref
from .router import route_ref

_DT = {torch.float32: 0, torch.bfloat16: 1}


def route_supported(logits, bias, top_k, scale, n_group=1, topk_group=1, normalize=True) -> bool:
    return n_group == 1 and logits.shape[-1] <= 512 and top_k <= 32


def route_kernel(logits, bias, top_k, scale, n_group=1, topk_group=1, normalize=True):
    """ops.route's kernel, in route_ref's signature (route_supported: one group only)."""
    return route_fast(logits, bias, top_k, scale, normalize)


def route_fast(logits, bias, top_k, scale, normalize=True):
    t, e = logits.shape
    if e > 512 or top_k > 32 or top_k > e:
        return route_ref(logits, bias, top_k, scale, 1, 1, normalize)
    from .build import check, library

    lg = logits.to(torch.float32).contiguous()
    b = bias.to(torch.float32).contiguous()
    ids = torch.empty(t, top_k, dtype=torch.int64, device=logits.device)
    w = torch.empty(t, top_k, dtype=torch.float32, device=logits.device)
    if t:
        rc = library().ddt_route(lg.data_ptr(), b.data_ptr(), t, e, top_k, float(scale), int(bool(normalize)),
                                 ids.data_ptr(), w.data_ptr(), torch.cuda.current_stream(logits.device).cuda_stream)
        check(rc, "ddt_route")
    return ids, w


def _norm(x, residual, weight, eps):
    d = x.shape[-1]
    layout = row_layout(x)
    if layout is None:
        x = x.contiguous()
        layout = row_layout(x)
    rows, inner, s_outer, s_inner = layout
    res2 = residual.reshape(-1, d).contiguous() if residual is not None else None
    w = weight.contiguous()
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(y) if residual is not None else None
    if rows:
        from .build import check, library

        rc = library().ddt_rms_norm(x.data_ptr(), res2.data_ptr() if res2 is not None else None, w.data_ptr(),
                                    rows, d, inner, s_outer, s_inner, float(eps), _DT[x.dtype], _DT[weight.dtype],
                                    y.data_ptr(), res_out.data_ptr() if res_out is not None else None,
                                    torch.cuda.current_stream(x.device).cuda_stream)
        check(rc, "ddt_rms_norm")
    return y, res_out


def _supported(x, weight):
    return x.dtype in _DT and weight.dtype in _DT and x.shape[-1] * 4 <= 48 * 1024 and weight.shape == x.shape[-1:]


def norm_supported(x, weight, eps) -> bool:
    return _supported(x, weight)


def add_norm_supported(x, residual, weight, eps) -> bool:
    return _supported(x, weight) and residual.dtype == x.dtype


def rms_norm_fast(x, weight, eps):
    if not _supported(x, weight):
        return rms_norm_ref(x, weight, eps)
    return _norm(x, None, weight, eps)[0]


def rms_norm_residual_fast(x, residual, weight, eps):
    """(rms_norm(x + residual), x + residual) in one pass; the sum is rounded to x.dtype first."""
    if not _supported(x, weight) or residual.dtype != x.dtype:
        return add_rms_norm_ref(x, residual, weight, eps)
    return _norm(x, residual, weight, eps)
