"""CPU products over weights packed once into the BLAS's own layout (oneDNN's reordered weights for bf16 and for
large float32 weights, MKL's packed SGEMM for the smaller float32 ones) instead of torch's plain F.linear, which
re-lays the weight out on every call.

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
PACKED = "_ddtree_packed"  # (the weight's version when packed, the packed form, whether it is oneDNN's)
HINT_ROWS = 16  # the row count the packing is laid out for; any row count may use it
ONEDNN_MIN = 1 << 18  # elements: a float32 weight this large packs for oneDNN, a smaller one for MKL (cpu_products.py)


@functools.cache
def _onednn(dtype: torch.dtype) -> bool:
    """Whether oneDNN's reordered product runs for dtype on this CPU. NOTE: its bf16 reorder needs AVX512 (bw, vl,
    dq) or AVX-NE-CONVERT and raises without them (an AVX2 CPU): one tiny product tells."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    w = torch.ones(16, 16, dtype=dtype)
    try:
        p = torch.ops.mkldnn._reorder_linear_weight(w, HINT_ROWS)
        return torch.equal(torch.ops.mkldnn._linear_pointwise(w, p, None, "none", [], ""), F.linear(w, w))
    except RuntimeError:
        return False


def _mkl() -> bool:
    return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


@functools.cache
def available(dtype: torch.dtype) -> bool:
    """Whether this torch build, on this CPU, has a packed product for dtype (float32: MKL or oneDNN; bf16: oneDNN)."""
    if dtype == torch.float32:
        return _mkl() or _onednn(dtype)
    return dtype == torch.bfloat16 and _onednn(dtype)


def _by_onednn(w: torch.Tensor) -> bool:
    """Whether w packs for oneDNN: bf16, or float32 of ONEDNN_MIN elements or more (or MKL missing). NOTE: oneDNN's
    float32 product costs more per call than MKL's and less per element (BENCHMARKS.md, "CPU figures")."""
    return w.dtype != torch.float32 or (_onednn(w.dtype) and (w.numel() >= ONEDNN_MIN or not _mkl()))


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


def _packed(w: torch.Tensor) -> tuple[torch.Tensor, bool] | None:
    """w's packed form and whether it is oneDNN's (packed on first use, again after an in-place write)."""
    if not getattr(w, FLAG, False):
        return None
    held = getattr(w, PACKED, None)
    if held is not None and held[0] == w._version:
        return held[1], held[2]
    onednn = _by_onednn(w)
    reorder = torch.ops.mkldnn._reorder_linear_weight if onednn else torch.ops.mkl._mkl_reorder_linear_weight
    p = reorder(w.detach(), HINT_ROWS)
    setattr(w, PACKED, (w._version, p, onednn))
    return p, onednn


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """F.linear(x, w) for x [M, K], w [N, K]: through w's packed form when mark() flagged w, else F.linear.
    NOTE: a float32 row alone takes F.linear on an MKL-packed weight: MKL's one-row path is as fast or faster."""
    use = x.device.type == "cpu" and x.dtype == w.dtype and not x.requires_grad
    form = _packed(w) if use else None
    if form is None or (not form[1] and x.shape[0] == 1):
        return F.linear(x, w)
    x = x.contiguous()
    if form[1]:
        return torch.ops.mkldnn._linear_pointwise(x, form[0], None, "none", [], "")
    return torch.ops.mkl._mkl_linear(x, form[0], w, None, x.shape[0])  # NOTE: the row count as the "packed for" size


def packable(w: torch.Tensor) -> bool:
    """Whether a product with w goes through a packed form (mark() flagged it)."""
    return getattr(w, FLAG, False)
