"""Programmatic dependent launch (sm_90 and later) for the Triton kernels of the target's forward.

A kernel launched this way may start while the kernel before it still runs: it first fetches what no earlier
kernel writes (a product's weights, into L2), then waits for the kernel before to finish and its writes to be
visible (griddepcontrol.wait) before it reads anything else, and lets the next kernel launch. At a TP rank's
shapes the forward is ~1,400 kernels of a few microseconds, most of them reading their weights from DRAM only
after the kernel before has drained: the weight fetch is what the overlap hides. No arithmetic changes.

Every kernel launched with launch_pdl=True must wait (wait_previous) before its first read of an activation: a
launch may precede the end of the kernel before it. Off unless DDTREE_PDL=1: on the H200 it measured slower
(BENCHMARKS.md, "Programmatic dependent launch")."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import knobs

# a product's weights are prefetched only when they fit inside L2 with room to spare (the H200's is 50 MB, the RTX
# PRO 6000's 128 MB): a larger prefetch would evict itself before the kernel reads it. K2.6's fused q_a + kv_a
# (30 MB, one per layer on every TP rank) fits; a TP=8 rank's lm head (293 MB) does not.
PREFETCH_MAX_BYTES = 32 << 20


_MAJOR: dict[int, int] = {}  # device index -> major compute capability


def enabled(device: torch.device) -> bool:
    """DDTREE_PDL=1 on a CUDA device of compute capability 9 or later (never in Triton's interpreter)."""
    if not knobs.pdl() or device.type != "cuda":
        return False
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _MAJOR:
        _MAJOR[idx] = torch.cuda.get_device_capability(idx)[0]
    return _MAJOR[idx] >= 9


def launch(device: torch.device, *weights: torch.Tensor | None) -> dict:
    """A kernel launch's PDL arguments: its PDL constexpr and Triton's launch_pdl option (always together: a kernel
    launched early must wait), and for a product (its weights given) PREFETCH where they all allow it."""
    on = enabled(device)
    args = {"PDL": on, "launch_pdl": on}
    if weights:
        ws = [w for w in weights if w is not None]
        args["PREFETCH"] = on and all(map(prefetchable, ws)) and sum(w.numel() * w.element_size() for w in ws) \
            <= PREFETCH_MAX_BYTES
    return args


def prefetchable(w: torch.Tensor) -> bool:
    """Whether a product's weight [.., N, K] may be prefetched row by row: rows contiguous along K, each row
    and its start 16-byte aligned (cp.async.bulk). Its size: launch() bounds all of a product's weights together."""
    row = w.shape[-1] * w.element_size()
    return (w.stride(-1) == 1 and row % 16 == 0 and (w.stride(-2) * w.element_size()) % 16 == 0
            and w.data_ptr() % 16 == 0)


@triton.jit
def wait_previous(PDL: tl.constexpr):
    """PDL: wait until the kernel before has finished and its writes are visible, then let the next one launch
    (its programs then wait in turn: at most one kernel ahead)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def prefetch_l2(ptrs, nbytes):
    """Bring nbytes (a multiple of 16) at each of ptrs (16-byte aligned) into L2: one bulk prefetch each, no
    register or shared memory used, nothing waits on it."""
    tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;", "=r,l,r",
                              [ptrs, nbytes], dtype=tl.int32, is_pure=False, pack=1)
