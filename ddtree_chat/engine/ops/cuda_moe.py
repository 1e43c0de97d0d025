"""INT4 W4A16 MoE on CUDA (csrc/moe_int4.cu): load-time repack into MMA-fragment order + the launcher.

The repack (torch, any device) turns compressed-tensors Int4Weight [E, N, K/8] / scales [E, N, K/32] into
  words  int32 [E, N/16, K/64, 32, 4]   scales int32 [E, N/16, K/32, 8] (= bf16 pairs rows g, g+8)
as documented at the top of moe_int4.cu. `emulate_dequant` inverts it with the kernel's own indexing,
so the layout is testable on CPU."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .int4 import Int4Weight, dequant_int4
from .moe import ExpertWeights
from .registry import exact

_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int64)


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """int32 [..., K/8] -> stored nibbles (q + 8) uint8 [..., K], lowest nibble first."""
    return ((packed.to(torch.int64).unsqueeze(-1) >> _SHIFTS.to(packed.device)) & 0xF).flatten(-2).to(torch.uint8)


def repack_words(packed: torch.Tensor) -> torch.Tensor:
    """[E, N, K/8] int32 (checkpoint) -> [E, N/16, K/64, 32, 4] int32 (kernel)."""
    e, n, kw = packed.shape
    k = kw * 8
    nib = _nibbles(packed).view(e, n // 16, 2, 8, k // 64, 4, 4, 2, 2)  # E NT h g KT c w ehi elo
    nib = nib.permute(0, 1, 4, 3, 5, 6, 8, 7, 2).reshape(e, n // 16, k // 64, 32, 4, 8)  # p = elo*4+ehi*2+h
    word = (nib.to(torch.int64) << _SHIFTS.to(packed.device)).sum(-1)
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32).contiguous()


def repack_scales(scale: torch.Tensor) -> torch.Tensor:
    """[E, N, K/32] bf16 -> [E, N/16, K/32, 8] int32 holding bf16 {row g, row g+8}."""
    e, n, g = scale.shape
    s = scale.to(torch.bfloat16).view(e, n // 16, 2, 8, g).permute(0, 1, 4, 3, 2).contiguous()
    return s.view(torch.int32).view(e, n // 16, g, 8)


def emulate_dequant(words: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Kernel-view inverse (float32): A[row, k] for row = 16*tile + g + 8*h,
    k = 64*it + 16*c + 4*w + e, from word w of lane 4g+c, nibble p = (e%2)*4 + (e//2)*2 + h."""
    e_, nt, kt = words.shape[:3]
    nib = _nibbles(words)  # [E, NT, KT, 32, 4*8] -> index (w, p)
    nib = nib.view(e_, nt, kt, 8, 4, 4, 2, 2, 2)  # g c w elo ehi h
    q = nib.permute(0, 1, 8, 3, 2, 4, 5, 7, 6).reshape(e_, nt * 16, kt * 64).float() - 8  # h g | it c w ehi elo
    s = scales.contiguous().view(torch.bfloat16).view(e_, nt, kt * 2, 8, 2).permute(0, 1, 4, 3, 2)
    s = s.reshape(e_, nt * 16, kt * 2).float().repeat_interleave(32, dim=-1)
    return (q * s).to(torch.bfloat16).float()


@dataclass
class PackedExperts(ExpertWeights):
    """Experts repacked for csrc/moe_int4.cu. gate/up/down are None (the checkpoint layout is freed)."""

    wg: torch.Tensor = None
    sg: torch.Tensor = None
    wu: torch.Tensor = None
    su: torch.Tensor = None
    wd: torch.Tensor = None
    sd: torch.Tensor = None
    hidden: int = 0
    inter: int = 0

    @property
    def num_experts(self) -> int:
        return self.wg.shape[0]


def can_pack(experts: ExpertWeights) -> bool:
    ws = (experts.gate, experts.up, experts.down)
    if not all(isinstance(w, Int4Weight) and w.group_size == 32 for w in ws):
        return False
    e, i, h = experts.gate.shape
    return h % 64 == 0 and i % 64 == 0 and experts.down.shape == (e, h, i) and experts.up.shape == (e, i, h)


def pack_experts(experts: ExpertWeights, chunk: int = 8) -> PackedExperts:
    """Repack chunk experts at a time (the uint8 nibble view of one K2.6 expert matrix is ~15 MB)."""
    def rep(w: Int4Weight):
        words = torch.cat([repack_words(w.packed[i:i + chunk]) for i in range(0, w.packed.shape[0], chunk)])
        return words, repack_scales(w.scale)

    e, i, h = experts.gate.shape
    wg, sg = rep(experts.gate)
    wu, su = rep(experts.up)
    wd, sd = rep(experts.down)
    return PackedExperts(None, None, None, wg=wg, sg=sg, wu=wu, su=su, wd=wd, sd=sd, hidden=h, inter=i)


_FORCED = __import__("os").environ.get("DDTREE_MOE_VARIANT")  # a fixed variant (benchmarks), else by token count
# moe_int4.cu kVariants: 0-3 tile sets, 4-7 the same bounds-checked, 8-13 other down tiles, 14-15 PDL, 16-17 kPipe,
# 18 14's tiles with a kPipe gate/up
N_VARIANTS = 19
MAX_TOPK = 16  # the most experts per token the combine takes (moe_int4.cu's kCombineTopk)
PICKED = (10, 14, 16, 18)  # what default_variant returns; the only ones built unless DDTREE_MOE_SWEEP=1


def built_variants() -> tuple[int, ...]:
    """The variants the kernel library has (moe_int4.cu builds the others only for the sweep)."""
    from ... import knobs

    return tuple(range(N_VARIANTS)) if knobs.moe_sweep() else PICKED


def default_variant(tokens: int) -> int:
    """The variant the sweep measured fastest per token count (kernels.py --only moe; BENCHMARKS.md): up to 4
    tokens the register-pipelined tiles (16: gate/up 4 warps x 2, two down row tiles per CTA of 2 x 2, each
    stage's loads issued before the previous stage's MMAs, with programmatic dependent launch); at 5-8 tokens
    14 (gate/up 4 x 4, down two row tiles of 2 x 8, PDL); beyond, 10 (14 without PDL, which lost from 16
    tokens). Row-invariant (the default on GPUs, docs/exactness.md): 18 for one token, 14 up to 8, then 10
    (18's pipelined gate/up lost to 14 at 2-4 tokens)."""
    if _FORCED is not None:
        return int(_FORCED)
    if exact():  # NOTE: 18, 14 and 10 share every tile (14 adds PDL, 18 pipelines gate/up): one K order per output
        return 18 if tokens == 1 else 14 if tokens <= 8 else 10
    return 16 if tokens <= 4 else 14 if tokens <= 8 else 10


def moe_forward(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, pe: PackedExperts,
                variant: int | None = None, residual: torch.Tensor | None = None) -> torch.Tensor:
    """The routed experts' output [T, H] in x's dtype, plus residual when given (a bf16 residual of a bf16 x
    is added inside the kernel's last launch, as a bf16 add would round it)."""
    from .build import check, library

    lib = library()
    t, k = ids.shape
    if k > MAX_TOPK:
        raise ValueError(f"{k} experts per token: the INT4 MoE kernel takes at most {MAX_TOPK}")
    h, inter, e = pe.hidden, pe.inter, pe.num_experts
    out = torch.empty(t, h, dtype=torch.bfloat16, device=x.device)
    fused = (residual is not None and x.dtype == torch.bfloat16 and residual.dtype == torch.bfloat16
             and residual.shape == (t, h))
    res = residual.contiguous() if fused else None
    if t == 0:
        return out.to(x.dtype) if residual is None else residual + out.to(x.dtype)
    xb = x.to(torch.bfloat16).contiguous()
    ids = ids.to(torch.int64).contiguous()
    w = weights.to(torch.float32).contiguous()
    pairs = t * k
    max_blocks = min(e, pairs) + (pairs + 7) // 8
    ws = torch.empty(max_blocks * 9 + 1, dtype=torch.int32, device=x.device)
    hbuf = torch.empty(pairs, inter, dtype=torch.bfloat16, device=x.device)
    ybuf = torch.empty(pairs, h, dtype=torch.float32, device=x.device)
    stream = torch.cuda.current_stream(x.device).cuda_stream
    rc = lib.ddt_moe_forward(xb.data_ptr(), ids.data_ptr(), w.data_ptr(), t, k, e, h, inter,
                             pe.wg.data_ptr(), pe.wu.data_ptr(), pe.sg.data_ptr(), pe.su.data_ptr(),
                             pe.wd.data_ptr(), pe.sd.data_ptr(), ws.data_ptr(), max_blocks,
                             hbuf.data_ptr(), ybuf.data_ptr(), out.data_ptr(), res.data_ptr() if fused else None,
                             default_variant(t) if variant is None else variant, stream)
    check(rc, "ddt_moe_forward")
    y = out if x.dtype == torch.bfloat16 else out.to(x.dtype)
    return y if fused or residual is None else residual + y


def moe_experts_fast(x, ids, weights, experts: PackedExperts, residual: torch.Tensor | None = None):
    """ops.moe_experts' kernel for packed experts (registry: supports PackedExperts only)."""
    return moe_forward(x, ids, weights, experts, residual=residual)


def can_pack_on_gpu(experts: ExpertWeights) -> bool:
    return can_pack(experts) and experts.gate.packed.is_cuda


def prepare_experts_fast(experts: ExpertWeights) -> ExpertWeights:
    """ops.prepare_experts' kernel (registry: supports can_pack_on_gpu); a library that does not build
    raises KernelBuildError (the registry logs it and keeps the checkpoint layout)."""
    from .build import library

    library()
    return pack_experts(experts)


__all__ = ["PackedExperts", "pack_experts", "repack_words", "repack_scales", "emulate_dequant", "moe_forward",
           "dequant_int4"]
