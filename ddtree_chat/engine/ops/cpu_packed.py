"""CPU products over weights packed once into the BLAS's own layout (MKL's packed SGEMM for float32, oneDNN's
reordered weights for bf16) instead of torch's plain F.linear, which re-lays the weight out on every call.

Why: a tree verify's products (9-33 rows) cost several times a one-row product through F.linear; packed, they cost
less at those rows (a round gains on an AR step), and the drafter's bf16 products less at every row count
(BENCHMARKS.md, "Packed CPU products"). The pure-torch twin is F.linear (tests/test_cpu_packed.py compares them).

How: `mark(model)` at load flags a CPU model's 2-D product weights (not embeddings); a flagged weight is packed
on its first product (so views that no product reads are never packed: no memory for them) and the packed form
rides on the weight tensor itself, dropped if the weight is later written in place. Off with DDTREE_CPU_PACK=0,
and in DDTREE_CPU_EXACT=1's row-invariant forms (ops/cpu_exact.py), which keep their own products."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from ...knobs import CPU_PACK, get

FLAG = "_ddtree_pack"  # set by mark(): pack this weight on first use
PACKED = "_ddtree_packed"  # (the weight's version when packed, the packed form)
HINT_ROWS = 16  # the row count the packing is laid out for; any row count may use it


@functools.cache
def available(dtype: torch.dtype) -> bool:
    """Whether this torch build, on this CPU, has the packed product for dtype (MKL for float32, oneDNN for bf16).
    NOTE: oneDNN's bf16 reorder needs AVX512 (bw, vl, dq) or AVX-NE-CONVERT and raises without them (an AVX2
    CPU): one tiny product tells."""
    if dtype == torch.float32:
        return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")
    if dtype != torch.bfloat16 or not (torch.backends.mkldnn.is_available()
                                       and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    w = torch.ones(16, 16, dtype=dtype)
    try:
        p = torch.ops.mkldnn._reorder_linear_weight(w, HINT_ROWS)
        return torch.equal(torch.ops.mkldnn._linear_pointwise(w, p, None, "none", [], ""), F.linear(w, w))
    except RuntimeError:
        return False


def mark(model: nn.Module) -> int:
    """Flag model's 2-D floating weights (parameters and buffers of every module but embeddings) for packing on
    first use; -> how many were flagged. Nothing when DDTREE_CPU_PACK=0 or the build lacks the packed product."""
    return sum(mark_tensor(t) for mod in model.modules()
               if not (isinstance(mod, nn.Embedding) or type(mod).__name__.endswith("Embedding"))  # VocabEmbedding too
               for t in list(mod.parameters(recurse=False)) + list(mod.buffers(recurse=False)) if t is not None)


def mark_tensor(w: torch.Tensor) -> bool:
    """mark() for one weight (e.g. the drafter's bf16 copy of the lm head, outside a module); -> whether flagged."""
    ok = get(CPU_PACK) != "0" and w.device.type == "cpu" and w.dim() == 2 and available(w.dtype) and w.is_contiguous()
    if ok:
        setattr(w, FLAG, True)
    return ok


def _pack(w: torch.Tensor) -> torch.Tensor:
    if w.dtype == torch.float32:
        return torch.ops.mkl._mkl_reorder_linear_weight(w, HINT_ROWS)
    return torch.ops.mkldnn._reorder_linear_weight(w, HINT_ROWS)


def _packed(w: torch.Tensor) -> torch.Tensor | None:
    if not getattr(w, FLAG, False):
        return None
    held = getattr(w, PACKED, None)
    if held is not None and held[0] == w._version:
        return held[1]
    p = _pack(w.detach())
    setattr(w, PACKED, (w._version, p))
    return p


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """F.linear(x, w) for x [M, K], w [N, K]: through w's packed form when mark() flagged w, else F.linear.
    NOTE: a float32 row alone takes F.linear: its one-row path is as fast or faster (BENCHMARKS.md)."""
    use = x.device.type == "cpu" and x.dtype == w.dtype and not x.requires_grad
    p = _packed(w) if use and (x.shape[0] > 1 or w.dtype != torch.float32) else None
    if p is None:
        return F.linear(x, w)
    x = x.contiguous()
    if w.dtype == torch.float32:  # NOTE: the row count as the "packed for" size: the packed path for any M
        return torch.ops.mkl._mkl_linear(x, p, w, None, x.shape[0])
    return torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")


def packable(w: torch.Tensor) -> bool:
    """Whether a product with w goes through a packed form (mark() flagged it)."""
    return getattr(w, FLAG, False)
