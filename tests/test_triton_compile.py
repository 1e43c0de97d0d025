"""The Triton kernels compile to cubins for the H200 (sm_90) and the RTX PRO 6000 Blackwell (sm_120)
without a GPU: triton.compile with an explicit target and Triton's bundled ptxas (small constexprs, so
the check stays quick; the GPU tests run the real sizes)."""

import pytest

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

TREE_SIGNATURE = {"LOGP": "*fp32", "IDS": "*i64", "ROOT": "*i64", "PI": "*i32", "PJ": "*i32", "KSC": "*fp32",
                  "KPAR": "*i32", "KTOK": "*i64", "SBUF": "*i64", "NODE": "*i32", "OTOK": "*i64", "OPAR": "*i64",
                  "ODEP": "*i64", "OLP": "*fp32", "K": "i32", "B": "i32", "D": "constexpr", "C": "constexpr",
                  "BP": "constexpr", "G": "constexpr"}
MM_SIGNATURE = dict({"X": "*fp32", "W": "*fp32", "O": "*fp32"},
                    **dict.fromkeys(["M", "N", "K", "BATCH", "sxb", "sxm", "sxk", "swb", "swn", "swk", "sob", "som",
                                     "son"], "i32"),
                    **dict.fromkeys(["PREC", "BLOCK_M", "BLOCK_N", "BLOCK_K"], "constexpr"))


@pytest.mark.parametrize("arch", [90, 120])
def test_triton_kernels_compile_for_hopper_and_blackwell(arch):
    from ddtree_chat.engine.ops import triton_linear, triton_tree

    tree = ASTSource(fn=triton_tree._tree_kernel, signature=TREE_SIGNATURE,
                     constexprs={"D": 2, "C": 16, "BP": 16, "G": 32})
    mm = ASTSource(fn=triton_linear._mm_nt_kernel.fn, signature=MM_SIGNATURE,
                   constexprs={"PREC": "tf32x3", "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32})
    for src in (tree, mm):
        kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32))
        assert len(kernel.asm["cubin"]) > 1000
