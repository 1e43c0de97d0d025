"""Registers and spills of the row-invariant MLA kernels (ops/triton_mla_exact) as ptxas compiles them for a
target, without a GPU: triton.compile with an explicit GPUTarget, then Triton's bundled ptxas -v on the PTX
(the flags Triton's own cubin step passes). Configurations: the constexprs and warps the launcher picks at 8
and 64 heads, bf16 (the engine's) and float32.

  PYTHONPATH=. python benchmarks/triton_resources.py [--arch 90] [--warps 4,8]"""

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
_CONSTS = ["R", "P", "RC", "PREC", "CHUNK", "SUB", "BLOCK_M", "BLOCK_N", "BLOCK_T"]
# NOTE: the launch specialises pointers and the strides outside do_not_specialize on 16-divisibility
# (K2.6's rows are 576 or heads x 576 elements wide), which decides the loads' vector width: mirrored here
_ALIGNED = _PTRS + ["s_ckv", "s_kpe", "sql_t", "sql_h", "sqp_t", "sqp_h"]
_MERGE_PTRS = ["OP", "LP", "O", "PLEN"]


def _src(fn, signature: dict, constexprs: dict, aligned: list[str]) -> ASTSource:
    names = fn.arg_names
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    return ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)


def exact_mla_configs(dtypes=(torch.bfloat16, torch.float32), heads=(8, 64), warps=None):
    """[(name, ASTSource, options)]: _mla_exact_kernel as mla_attention_exact launches it (K2.6's latent:
    512 + 64 columns) per head count and dtype, and its _merge_kernel per head count (CHUNK) and output
    dtype. warps: the main kernel's num_warps (default: triton_mla_exact.WARPS)."""
    out = []
    for dtype in dtypes:
        ty = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]
        sig = dict({p: f"*{ty}" if p in ("QL", "QP", "CKV", "KPE") else "*fp32" for p in _PTRS},
                   PLEN="*i64", MASK="*u8", scale_log2="fp32", **dict.fromkeys(_INTS, "i32"),
                   **dict.fromkeys(_CONSTS, "constexpr"))
        for nh in heads:
            for w in warps or (ex.WARPS,):
                consts = {"R": 512, "P": 64, "RC": 512 // 4, "PREC": "ieee" if dtype == torch.float32 else "tf32",
                          "CHUNK": ex.chunk_keys(nh), "SUB": ex.SUB_KEYS, "BLOCK_M": ex.BLOCK_M,
                          "BLOCK_N": ex.block_n(dtype), "BLOCK_T": ex.BLOCK_T}
                out.append((f"_mla_exact_kernel {ty} heads={nh} warps={w}",
                            _src(ex._mla_exact_kernel, sig, consts, _ALIGNED), {"num_warps": w, "num_stages": 2}))
            msig = dict({"OP": "*fp32", "LP": "*fp32", "O": f"*{ty}", "PLEN": "*i64"},
                        **dict.fromkeys(["M", "NCS", "NTL", "F", "s_lp"], "i32"),
                        **dict.fromkeys(["CHUNK", "R", "BLOCK_S", "BLOCK_R"], "constexpr"))
            mconsts = {"CHUNK": ex.chunk_keys(nh), "R": 512, "BLOCK_S": ex.MERGE_S, "BLOCK_R": 128}
            out.append((f"_merge_kernel {ty} heads={nh}", _src(ex._merge_kernel, msig, mconsts, _MERGE_PTRS),
                        {"num_warps": ex.MERGE_WARPS}))
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
    for name, src, opts in exact_mla_configs(**kw):
        out[name] = ptxas_resources(triton.compile(src, target=GPUTarget("cuda", arch, 32), options=opts), arch)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--warps", default=None, help="main kernel num_warps to compile, e.g. 4,8 (default: WARPS)")
    a = ap.parse_args()
    warps = tuple(int(w) for w in a.warps.split(",")) if a.warps else None
    print(f"sm_{a.arch}: {'config':44} {'regs':>5} {'spill st':>9} {'spill ld':>9} {'stack':>6} {'shared':>7}")
    for name, r in resources(a.arch, warps=warps).items():
        print(f"{'':7}{name:44} {r['regs']:5} {r['spill_stores']:9} {r['spill_loads']:9} {r['stack']:6} "
              f"{r['shared']:7}", flush=True)


if __name__ == "__main__":
    main()
