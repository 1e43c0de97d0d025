"""Registers and spills of the row-invariant MLA kernels (ops/triton_mla_exact) as ptxas compiles them for a
target, without a GPU: triton.compile with an explicit GPUTarget, then Triton's bundled ptxas -v on the PTX
(the flags Triton's own cubin step passes). Configurations: the constexprs and warps the launcher picks at 8
and 64 heads, bf16 (the engine's) and float32, with the key tile block_n picks for the target's shared memory
per block. --shapes: every tile of BLOCK_NS at several latent widths, its shared memory against the bound
block_n goes by (shared_bytes).

  PYTHONPATH=. python benchmarks/triton_resources.py [--arch 90] [--warps 4,8] [--block-m 32] [--shapes]"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ddtree_chat.engine.ops import triton_mla_exact as ex  # noqa: E402

_PTRS = ["QL", "QP", "CKV", "KPE", "PLEN", "MASK", "OP", "LP"]
_INTS = ["M", "T", "NH", "NCS", "HB", "F", "s_lp", "s_ckv", "s_kpe", "sql_t", "sql_h", "sqp_t", "sqp_h"]
_CONSTS = ["R", "P", "RC", "PREC", "CHUNK", "SUB", "BLOCK_M", "BLOCK_N", "BLOCK_T", "PDL"]
# NOTE: the launch specialises pointers and the strides outside do_not_specialize on 16-divisibility
# (K2.6's rows are 576 or heads x 576 elements wide), which decides the loads' vector width: mirrored here
_ALIGNED = _PTRS + ["s_ckv", "s_kpe", "sql_t", "sql_h", "sqp_t", "sqp_h"]
_MERGE_PTRS = ["OP", "LP", "O", "PLEN"]
# the opt-in shared memory per block (what Triton's launch checks) by compute capability, CUDA's tables
SHARED_PER_BLOCK = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024, 100: 227 * 1024, 120: 99 * 1024}
_TY = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def _src(fn, signature: dict, constexprs: dict, aligned: list[str]) -> ASTSource:
    names = fn.arg_names
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    return ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)


def _main_src(dtype, r: int, p: int, chunk: int, block_n: int, pdl: bool = False) -> ASTSource:
    """_mla_exact_kernel as mla_attention_exact builds it for a [*, r] latent and [*, p] rope part."""
    ty = _TY[dtype]
    sig = dict({a: f"*{ty}" if a in ("QL", "QP", "CKV", "KPE") else "*fp32" for a in _PTRS},
               PLEN="*i64", MASK="*u8", scale_log2="fp32", **dict.fromkeys(_INTS, "i32"),
               **dict.fromkeys(_CONSTS, "constexpr"))
    consts = {"R": r, "P": p, "RC": r // 4, "PREC": "ieee" if dtype == torch.float32 else "tf32", "CHUNK": chunk,
              "SUB": ex.SUB_KEYS, "BLOCK_M": ex.BLOCK_M, "BLOCK_N": block_n, "BLOCK_T": ex.BLOCK_T, "PDL": pdl}
    return _src(ex._mla_exact_kernel, sig, consts, _ALIGNED)


def exact_mla_configs(dtypes=(torch.bfloat16, torch.float32), heads=(8, 64), warps=None, arch: int = 90,
                      pdl: bool = False):
    """[(name, ASTSource, options)]: _mla_exact_kernel as mla_attention_exact launches it on sm_<arch> (K2.6's
    latent: 512 + 64 columns; the key tile block_n picks for that arch's shared memory per block) per head
    count and dtype, and its _merge_kernel per head count (CHUNK), states per chunk and output dtype. warps: the main kernel's
    num_warps (default: the launch's, triton_mla_exact.main_warps); pdl: as launched with DDTREE_PDL=1."""
    out = []
    for dtype in dtypes:
        ty = _TY[dtype]
        bn = ex.block_n(dtype, 512 + 64, SHARED_PER_BLOCK[arch])
        for nh in heads:
            for w in warps or (ex.main_warps(dtype, arch // 10),):
                out.append((f"_mla_exact_kernel {ty} heads={nh} warps={w} BLOCK_N={bn}",
                            _main_src(dtype, 512, 64, ex.chunk_keys(nh), bn, pdl), {"num_warps": w, "num_stages": 2}))
            msig = dict({"OP": "*fp32", "LP": "*fp32", "O": f"*{ty}", "PLEN": "*i64"},
                        **dict.fromkeys(["M", "NCS", "NTL", "s_lp"], "i32"),
                        **dict.fromkeys(["F", "CHUNK", "R", "BLOCK_S", "BLOCK_R", "PDL"], "constexpr"))
            block_s, block_r = ex.merge_layout(nh)
            for f in (1, ex.chunk_keys(nh) // ex.SUB_KEYS):  # a state per chunk, or one per sub-chunk (the fold)
                mconsts = {"F": f, "CHUNK": ex.chunk_keys(nh), "R": 512, "BLOCK_S": block_s, "BLOCK_R": block_r,
                           "PDL": pdl}
                out.append((f"_merge_kernel {ty} heads={nh} F={f}", _src(ex._merge_kernel, msig, mconsts, _MERGE_PTRS),
                            {"num_warps": ex.MERGE_WARPS, "enable_fp_fusion": ex.MERGE_FP_FUSION}))
    return out


def ptxas_resources(kernel, arch: int) -> dict:
    """ptxas -v's report of a compiled kernel's PTX: registers, spill store / load bytes, stack frame bytes,
    and Triton's shared memory."""
    import inspect

    from triton.backends.nvidia import compiler

    # NOTE: the register allocator's level only where this Triton's own cubin step passes it (3.9 does, 3.6 not)
    own = inspect.getsource(compiler.CUDABackend.make_cubin)
    extra = ["--regAllocOptLevel=2"] if "regAllocOptLevel=2" in own else []
    ptx = kernel.asm["ptx"]
    target = re.search(r"^\.target\s+(\w+)", ptx, re.M)[1]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "k.ptx"
        path.write_text(ptx)
        res = subprocess.run([compiler.get_ptxas(arch).path, "-v", "-lineinfo", *extra, f"--gpu-name={target}",
                              str(path), "-o", str(path.with_suffix(".o"))], capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(res.stderr[-2000:])
    spill = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", res.stderr)
    regs = re.search(r"Used (\d+) registers", res.stderr)
    return {"regs": int(regs[1]), "spill_stores": int(spill[2]), "spill_loads": int(spill[3]),
            "stack": int(spill[1]), "shared": kernel.metadata.shared}


def resources(arch: int = 90, **kw) -> dict:
    """{config name: ptxas_resources} for every exact_mla_configs entry (compiled one at a time)."""
    out = {}
    for name, src, opts in exact_mla_configs(arch=arch, **kw):
        out[name] = ptxas_resources(triton.compile(src, target=GPUTarget("cuda", arch, 32), options=opts), arch)
    return out


def shapes(arch: int):
    """Every tile of BLOCK_NS per dtype at latent widths from the demo's (64 + 16) to 1024 + 64: the compiled
    kernel's shared memory, shared_bytes' bound for it, and whether block_n would pick it on sm_<arch>."""
    print(f"sm_{arch} (limit {SHARED_PER_BLOCK[arch]}): dtype    R    P BLOCK_N  shared   bound picked")
    for dtype in (torch.bfloat16, torch.float32):
        for r, p in ((64, 16), (128, 32), (256, 64), (512, 64), (512, 128), (1024, 64)):
            pick = ex.block_n(dtype, r + p, SHARED_PER_BLOCK[arch])
            for bn in ex.BLOCK_NS[dtype]:
                k = triton.compile(_main_src(dtype, r, p, 1024, bn), target=GPUTarget("cuda", arch, 32),
                                   options={"num_warps": ex.main_warps(dtype, arch // 10), "num_stages": 2})
                print(f"{'':25}{_TY[dtype]:>5} {r:4} {p:4} {bn:7} {k.metadata.shared:7} "
                      f"{ex.shared_bytes(bn, dtype.itemsize, r + p):7} {'yes' if bn == pick else '':>6}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", type=int, default=90, choices=sorted(SHARED_PER_BLOCK))
    ap.add_argument("--warps", default=None, help="main kernel num_warps to compile, e.g. 4,8 (default: the launch's)")
    ap.add_argument("--shapes", action="store_true", help="shared memory of every tile at several latent widths")
    ap.add_argument("--block-m", type=int, default=None, help="query rows a program (default: the launch's "
                    "triton_mla_exact.BLOCK_M; kernels.py --only exact times 32 beside it)")
    a = ap.parse_args()
    if a.block_m:
        ex.BLOCK_M = a.block_m  # NOTE: read at compile time by _main_src and block_n's shared-memory bound
    if a.shapes:
        return shapes(a.arch)
    warps = tuple(int(w) for w in a.warps.split(",")) if a.warps else None
    print(f"sm_{a.arch}: {'config':55} {'regs':>5} {'spill st':>9} {'spill ld':>9} {'stack':>6} {'shared':>7}")
    for name, r in resources(a.arch, warps=warps).items():
        print(f"{'':7}{name:55} {r['regs']:5} {r['spill_stores']:9} {r['spill_loads']:9} {r['stack']:6} "
              f"{r['shared']:7}", flush=True)


if __name__ == "__main__":
    main()
