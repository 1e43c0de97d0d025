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
MM_SIGNATURE = dict({"X": "*fp32", "W": "*fp32", "W2": "*fp32", "O": "*fp32", "PART": "*fp32", "LOCK": "*i32",
                     "NW": "*fp32", "eps": "fp32", "IDS": "*i64", "RW": "*fp32", "RES": "*fp32"},
                    **dict.fromkeys(["n_top", "s_top", "n_routed", "srm", "M", "N", "K", "BATCH", "sxb", "sxm", "sxk", "swb", "swn", "swk",
                                     "sob", "som", "son"], "i32"),
                    **dict.fromkeys(["PREC", "GLU", "BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT", "NORM", "ROUTE", "ADD",
                                     "M_INNER", "PDL", "PREFETCH"], "constexpr"))
# the same with bf16 operands and output (the row-invariant products')
MM_BF16_SIGNATURE = {k: "*bf16" if v == "*fp32" and k in ("X", "W", "W2", "O", "RES") else v
                     for k, v in MM_SIGNATURE.items()}

ROPE_SIGNATURE = dict({"X": "*bf16", "COS": "*bf16", "SIN": "*bf16", "O": "*bf16", "W": "*bf16"},
                      **dict.fromkeys(["R", "H", "T", "inner", "s_outer", "s_inner", "s_w", "s_cs"], "i32"), eps="fp32",
                      **dict.fromkeys(["HALF", "BLOCK_D", "INTERLEAVED", "BLOCK_R", "NORM", "PDL"], "constexpr"))

LATENT_SIGNATURE = dict({"KV": "*bf16", "W": "*bf16", "COS": "*bf16", "SIN": "*bf16", "CKV": "*bf16", "KPE": "*bf16",
                         "SLOTS": "*i64", "slot0": "i32", "skv": "i32", "sc": "i32", "sp": "i32", "s_cs": "i32",
                         "eps": "fp32"},
                        **dict.fromkeys(["R", "HALF", "BLOCK_R", "BLOCK_H", "HAS_SLOTS", "PDL"], "constexpr"))

NORM_SIGNATURE = dict({"X": "*bf16", "RES": "*bf16", "W": "*bf16", "Y": "*bf16", "RES_OUT": "*bf16", "inner": "i32",
                       "s_outer": "i32", "s_inner": "i32", "eps": "fp32"},
                      **dict.fromkeys(["D", "BLOCK", "HAS_RES", "PDL"], "constexpr"))

MASK_SIGNATURE = {"PAR": "*i64", "M": "*i8", "N": "i32", "DEPTH": "constexpr", "BLOCK": "constexpr"}
WALK_SIGNATURE = {"PAR": "*i64", "TOK": "*i64", "CHOICE": "*i64", "OK": "*i8", "BONUS": "*i64", "DEP": "*i64",
                  "STATE": "*i64", "PATH": "*i64", "SLOTS": "*i64", "N": "i32", "DEPTH": "constexpr",
                  "BLOCK": "constexpr", "COMMIT": "constexpr", "LB": "constexpr", "DRAFTING": "constexpr"}
MOVE_SIGNATURE = dict({"CKV": "*bf16", "KPE": "*bf16", "SRC": "*i64", "DST": "*i64"},
                      **dict.fromkeys(["n", "s_cl", "s_cs", "s_pl", "s_ps"], "i32"),
                      **dict.fromkeys(["R", "P", "BLOCK"], "constexpr"))
PACK_SIGNATURE = {"TOK": "*i64", "PAR": "*i64", "DEP": "*i64", "LP": "*fp32", "CH": "*i64", "OK": "*u8",
                  "BONUS": "*i64", "OUT": "*fp64", "n": "i32", "BLOCK": "constexpr"}

MLA_SIGNATURE = dict({"QL": "*bf16", "QP": "*bf16", "CKV": "*bf16", "KPE": "*bf16", "PLEN": "*i64", "MASK": "*u8",
                      "OP": "*fp32", "LP": "*fp32"},
                     **dict.fromkeys(["M", "T", "NH", "n_splits", "n_tree", "SCAP"], "i32"), scale_log2="fp32",
                     **dict.fromkeys(["s_ckv", "s_kpe", "sql_t", "sql_h", "sqp_t", "sqp_h"], "i32"),
                     **dict.fromkeys(["R", "P", "RC", "PREC", "BLOCK_M", "BLOCK_N"], "constexpr"))

DRAFT_ATTN_SIGNATURE = dict({"Q": "*fp32", "KC": "*fp32", "VC": "*fp32", "KB": "*fp32", "VB": "*fp32", "MASK": "*u8",
                             "HELD": "*i64", "OP": "*fp32", "LP": "*fp32", "N": "i32", "B": "i32", "n_splits": "i32",
                             "scale_log2": "fp32"},
                            **dict.fromkeys(["sq_b", "sq_h", "skc_n", "skc_g", "svc_n", "svc_g", "skb_n", "skb_g",
                                             "svb_n", "svb_g", "sm_b"], "i32"),
                            **dict.fromkeys(["NH", "REP", "D", "BLOCK_M", "BLOCK_N", "HAS_MASK", "HAS_HELD", "PREC"],
                                            "constexpr"))

TOPK_CHUNK_SIGNATURE = {"X": "*bf16", "CAND": "*i64", "STATS": "*fp32", "V": "i32", "sx": "i32", "C": "i32",
                        "CHUNK": "constexpr", "K": "constexpr"}
TOPK_MERGE_SIGNATURE = {"CAND": "*i64", "STATS": "*fp32", "VALS": "*fp32", "IDS": "*i64", "C": "i32", "k": "i32",
                        "K": "constexpr", "CB": "constexpr"}


@pytest.mark.parametrize("arch", [90, 120])
def test_triton_kernels_compile_for_hopper_and_blackwell(arch):
    from ddtree_chat.engine.ops import (triton_draft_attention, triton_latent, triton_linear, triton_mla, triton_norm,
                                        triton_rope, triton_topk, triton_tree)

    tree = ASTSource(fn=triton_tree._tree_kernel, signature=TREE_SIGNATURE,
                     constexprs={"D": 2, "C": 16, "BP": 16, "G": 32})
    mm = [ASTSource(fn=triton_linear._mm_nt_kernel, signature=MM_SIGNATURE,
                    constexprs={"PREC": prec, "GLU": glu, "BLOCK_M": bm, "BLOCK_N": 32, "BLOCK_K": 32,
                                "SPLIT": split, "NORM": norm, "ROUTE": route, "ADD": add})
          # tensor-core dots and the FFMA form down to one row; GLU; split-K with the residual add; the norm;
          # the routed GLU
          for prec, bm in (("tf32x3", 16), ("fma", 1), ("fma", 16))
          for glu, split, norm, route, add in ((True, 1, False, 0, False), (False, 6, False, 0, True),
                                               (False, 1, True, 0, False), (True, 1, False, 8, False))]
    rope = ASTSource(fn=triton_rope._rope_kernel, signature=ROPE_SIGNATURE,
                     constexprs={"HALF": 32, "BLOCK_D": 64, "INTERLEAVED": False, "BLOCK_R": 32, "NORM": True})
    latent = ASTSource(fn=triton_latent._latent_kernel, signature=LATENT_SIGNATURE,
                       constexprs={"R": 512, "HALF": 32, "BLOCK_R": 512, "BLOCK_H": 32, "HAS_SLOTS": True})
    norm = ASTSource(fn=triton_norm._norm_kernel, signature=NORM_SIGNATURE,
                     constexprs={"D": 7168, "BLOCK": 8192, "HAS_RES": True})
    mask = ASTSource(fn=triton_tree._ancestor_kernel, signature=MASK_SIGNATURE, constexprs={"DEPTH": 7, "BLOCK": 64})
    walk = ASTSource(fn=triton_tree._walk_kernel, signature=WALK_SIGNATURE,
                     constexprs={"DEPTH": 7, "BLOCK": 64, "COMMIT": True, "LB": 8, "DRAFTING": True})
    pack = ASTSource(fn=triton_tree._pack_kernel, signature=PACK_SIGNATURE, constexprs={"BLOCK": 512})
    move = ASTSource(fn=triton_latent._move_kernel, signature=MOVE_SIGNATURE, constexprs={"R": 512, "P": 64, "BLOCK": 128})
    mla = ASTSource(fn=triton_mla._mla_split_kernel.fn, signature=MLA_SIGNATURE,
                    constexprs={"R": 512, "P": 64, "RC": 128, "PREC": "tf32", "BLOCK_M": 16, "BLOCK_N": 16})
    draft = ASTSource(fn=triton_draft_attention._draft_attn_kernel, signature=DRAFT_ATTN_SIGNATURE,
                      constexprs={"NH": 4, "REP": 2, "D": 64, "BLOCK_M": 16, "BLOCK_N": 64, "HAS_MASK": False,
                                  "HAS_HELD": True, "PREC": "tf32x3"})
    chunk, k, c = triton_topk.plan(163840, 64)  # K2.6's vocabulary at the largest budget the kernel serves
    topk = [ASTSource(fn=triton_topk._chunk_kernel, signature=TOPK_CHUNK_SIGNATURE, constexprs={"CHUNK": chunk, "K": k}),
            ASTSource(fn=triton_topk._merge_kernel, signature=TOPK_MERGE_SIGNATURE,
                      constexprs={"K": k, "CB": triton.next_power_of_2(c)})]
    for src in (tree, *mm, rope, latent, norm, mask, walk, pack, move, mla, draft, *topk):
        kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32))
        assert len(kernel.asm["cubin"]) > 1000


def test_mla_autotune_choices_are_reported(monkeypatch):
    """benchmarks/profile_round.py prints the MLA configs the autotuner chose (they moved an MLA time 2.5x
    between two runs of one commit, BENCHMARKS.md): key fields joined, the config as Triton prints it."""
    from ddtree_chat.engine.ops import triton_mla

    cfg = triton_mla._CONFIGS[-1]
    monkeypatch.setattr(triton_mla._mla_split_kernel, "cache", {(4, 16, 4096, "torch.float32"): cfg}, raising=False)
    assert triton_mla.tuned_configs() == {"4,16,4096,torch.float32": str(cfg)}
    assert "BLOCK_M: 16" in str(cfg) and "BLOCK_N: 16" in str(cfg)


def test_mla_split_plan_follows_the_measured_rule(monkeypatch):
    """One program per SM for up to two 64-row blocks, two beyond (BENCHMARKS.md); never
    splits below MIN_SPLIT_KEYS keys, at least one split."""
    from ddtree_chat.engine.ops import triton_mla

    monkeypatch.setattr(triton_mla, "sm_count", lambda dev: 132)
    assert triton_mla.plan_splits(64, 131072, None) == 132  # 1 token x 64 heads: one wave
    assert triton_mla.plan_splits(128, 131072, None) == 66  # 16 tokens x 8 heads: two row blocks, one wave
    assert triton_mla.plan_splits(1024, 131072, None) == 17  # 16 blocks: two waves
    assert triton_mla.plan_splits(8, 4096, None) == 16  # the prefix bounds it
    assert triton_mla.plan_splits(8, 0, None) == 1


SM120_SHARED_PER_BLOCK = 99 * 1024  # compute capability 12.x: 100 KB per SM, 99 KB for one block


def test_mla_tiles_that_fit_an_sm120_block():
    """The MLA autotuner's tiles compiled for sm_120 (the RTX PRO 6000 Blackwell) at K2.6's latent (512 + 64,
    bf16): those over 99 KB of shared memory are skipped there (OutOfResources at tuning), so the list must
    keep tiles that fit, a 64-key tile among them (the H200's pick at 1-16 tokens). `pytest -s` prints each
    tile's bytes (BENCHMARKS.md)."""
    from ddtree_chat.engine.ops import triton_mla

    fits, shared = [], {}
    for cfg in triton_mla._CONFIGS:
        kw = cfg.all_kwargs()
        src = ASTSource(fn=triton_mla._mla_split_kernel.fn, signature=MLA_SIGNATURE,
                        constexprs={"R": 512, "P": 64, "RC": 128, "PREC": "tf32", "BLOCK_M": kw["BLOCK_M"],
                                    "BLOCK_N": kw["BLOCK_N"]})
        kernel = triton.compile(src, target=GPUTarget("cuda", 120, 32),
                                options={"num_warps": kw["num_warps"], "num_stages": kw["num_stages"]})
        shared[f"{kw['BLOCK_M']}x{kw['BLOCK_N']} w{kw['num_warps']} s{kw['num_stages']}"] = kernel.metadata.shared
        if kernel.metadata.shared <= SM120_SHARED_PER_BLOCK:
            fits.append((kw["BLOCK_M"], kw["BLOCK_N"]))
    print("sm_120 MLA tile shared bytes:", shared)
    assert (16, 64) in fits and (16, 16) in fits, shared


@pytest.mark.parametrize("arch", [90, 120])
def test_row_invariant_kernels_compile_within_an_sm120_block(arch, monkeypatch):
    """The row-invariant product at K2.6's shapes (bf16 at its table's tile with and without split-K and at
    every tile the exact sweep may put in the table: 16-, 32- and 64-row blocks; the taller blocks block_m takes
    for more rows; the GLU form at the gate/up shapes), and the router's float32 form, compile for sm_90 and sm_120, each within the 99 KB of shared
    memory an sm_120 block may hold. (The row-invariant MLA as
    launched on each: test_row_invariant_mla_*.)"""
    import torch
    from exact_tiles import candidates

    from ddtree_chat.engine.ops import triton_exact_linear as el
    from ddtree_chat.engine.ops import triton_linear

    monkeypatch.setattr(el, "sm_count", lambda dev: 188)  # the RTX PRO 6000 Blackwell's SMs
    bm, bn, bk, warps, stages, _ = el.tile(2112, 7168, 1, torch.bfloat16, None)
    tiles = [(bm, bn, bk, warps, stages, split) for split in (1, 4)]
    # NOTE: sm_120 (the tighter shared memory) compiles every candidate's shape, sm_90 the 64-row ones (wgmma)
    some = [t for t in map(tuple, candidates()) if t != el.FP32_TILE and (arch == 120 or t[0] == 64)]
    tiles += {(t[0], t[1], t[2], t[4]): (*t[:5], 2) for t in some}.values()  # split-K's path; warps aside
    # the taller blocks block_m gives each table shape at 17 and 65 rows
    tiles += {el.tile(n, k, 1, torch.bfloat16, None, m) for n, k in el.TILES for m in (17, 65)}
    srcs = [(ASTSource(fn=triton_linear._mm_nt_kernel, signature=MM_BF16_SIGNATURE,
                       constexprs={"PREC": "tf32", "GLU": False, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
                                   "SPLIT": split, "NORM": False, "ROUTE": 0, "ADD": True, "M_INNER": True}),
             {"num_warps": warps, "num_stages": stages}) for bm, bn, bk, warps, stages, split in tiles]
    # the GLU form (two weight tiles a stage) at the gate/up shapes: K2.6's dense MLP and shared expert, and a
    # TP=8 rank's, at the heights block_m takes for 1, 17 and 65 rows
    glu = {el.tile(n, 7168, 1, torch.bfloat16, None, m) for n in (18432, 2048, 2304, 256) for m in (1, 17, 65)}
    srcs += [(ASTSource(fn=triton_linear._mm_nt_kernel, signature=MM_BF16_SIGNATURE,
                        constexprs={"PREC": "tf32", "GLU": True, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
                                    "SPLIT": split, "NORM": False, "ROUTE": 0, "ADD": False, "M_INNER": True}),
              {"num_warps": warps, "num_stages": stages}) for bm, bn, bk, warps, stages, split in glu]
    bm, bn, bk, warps, stages, _ = el.FP32_TILE  # a float32 gate's router logits: the FFMA form, split K
    srcs.append((ASTSource(fn=triton_linear._mm_nt_kernel, signature=MM_SIGNATURE,
                           constexprs={"PREC": "fma", "GLU": False, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
                                       "SPLIT": 4, "NORM": False, "ROUTE": 0, "ADD": False, "M_INNER": True}),
                 {"num_warps": warps, "num_stages": stages}))
    for src, opts in srcs:  # NOTE: one at a time: Python 3.11's ast.parse is not safe across threads
        kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=opts)
        assert kernel.metadata.shared <= SM120_SHARED_PER_BLOCK, (src.fn.__name__, src.constexprs,
                                                                  kernel.metadata.shared)
    # NOTE: the router's float32 form stays scalar float32 (a broadcast sum with every side >= 16 becomes a
    # plain-TF32 MMA); sm_90 fuses it into FFMAs, this Triton's sm_120 code multiplies and adds
    assert "mma" not in kernel.asm["ptx"] and ("fma.rn.f32" in kernel.asm["ptx"] or arch != 90)


def _exact_mla_resources(arch: int, bf16_heads: tuple) -> dict:
    """triton_resources.resources for sm_<arch>: bf16 at bf16_heads, float32 at 64 heads (its 8-head build
    differs in CHUNK only); skips where this Triton has no ptxas for the arch."""
    import sys
    from pathlib import Path

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import triton_resources

    try:
        from triton.backends.nvidia.compiler import get_ptxas
        get_ptxas(arch).path
    except Exception as e:  # a Triton without the CUDA backend's bundled ptxas: nothing to compile with
        pytest.skip(f"no ptxas for sm_{arch}: {e!r}")
    found = triton_resources.resources(arch, dtypes=(torch.bfloat16,), heads=bf16_heads)
    found.update(triton_resources.resources(arch, dtypes=(torch.float32,), heads=(64,)))
    assert len(found) == 3 * len(bf16_heads) + 3, sorted(found)  # a kernel and two merges (F) each
    return found


def test_row_invariant_mla_merges_leave_no_multiply_and_add_to_fuse():
    """The MLA merge is compiled per stored states a chunk (F = 1 for a tree's launch, 4 for an AR step's at 8
    heads), so its builds must round alike: built as the launch builds them, their PTX holds only round-to-
    nearest float32 adds, subtractions and multiplies (ptxas fuses no pair into an FMA) and FMAs the source
    asks for; with contraction on, plain mul.f32 / add.f32 would appear."""
    import re
    import sys
    from pathlib import Path

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import triton_resources

    merges = [(n, src, opts) for n, src, opts in triton_resources.exact_mla_configs(dtypes=(torch.bfloat16,), heads=(8,))
              if n.startswith("_merge_kernel")]
    assert len(merges) == 2, [n for n, _, _ in merges]
    for name, src, opts in merges:
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["ptx"]
        fusable = re.findall(r"^\s*(?:add|sub|mul)\.f32\b", ptx, re.M)
        assert not fusable and re.search(r"^\s*mul\.rn\.f32", ptx, re.M), (name, fusable[:3])


def test_row_invariant_mla_compiles_for_hopper_within_its_spill_budget():
    """The row-invariant MLA kernel and its merge as mla_attention_exact launches them on sm_90 (bf16 at 8 and
    64 heads' chunks, float32 at 64; the launch's 16-divisible pointers and strides), from ptxas -v
    (benchmarks/triton_resources.py prints every configuration): float32 (8 warps) and the merges spill nothing;
    bf16 runs at 4 warps, whose few spilled bytes cost less than 8 warps' (timed side by side on the H200,
    BENCHMARKS.md), within 256 B; the key tiles are sm_90's (32 float32, 64 bf16)."""
    found = _exact_mla_resources(90, (8, 64))
    assert sum("BLOCK_N=32" in n for n in found) == 1 and sum("BLOCK_N=64" in n for n in found) == 2, sorted(found)
    assert sum("bf16" in n and "warps=4" in n for n in found) == 2, sorted(found)  # the launch's warps
    over = {name: r for name, r in found.items()
            if max(r["spill_stores"], r["spill_loads"], r["stack"]) > (256 if "bf16" in name and "warps=4" in name else 0)}
    assert not over, over


def test_row_invariant_mla_fits_an_sm120_block_without_spills():
    """The same on sm_120 (the RTX PRO 6000 Blackwell), bf16 at a TP=8 rank's 8 heads and at 64, float32 at 64,
    and their merges (each head count's layout): each
    within the 99 KB of shared memory a block may hold there (float32 takes the 16-key tile) and without
    spills, so the engine's float32 and bf16 paths both launch the row-invariant kernel."""
    import re

    from ddtree_chat.engine.ops import triton_mla_exact as ex

    found = _exact_mla_resources(120, (8, 64))
    assert sum("BLOCK_N=16" in n for n in found) == 1 and sum("BLOCK_N=64" in n for n in found) == 2, sorted(found)
    bad = {name: r for name, r in found.items()
           if r["shared"] > SM120_SHARED_PER_BLOCK or r["spill_stores"] or r["spill_loads"] or r["stack"]}
    assert not bad, bad
    for name, r in found.items():  # the bound block_n goes by covers what this Triton allocates
        if tile := re.search(r"(bf16|fp32) .*BLOCK_N=(\d+)", name):
            assert r["shared"] <= ex.shared_bytes(int(tile[2]), 2 if tile[1] == "bf16" else 4, 576), (name, r)


def test_exact_mla_key_tile_by_device_and_dtype():
    """triton_mla_exact.block_n: the widest key tile whose shared memory fits the device's block, by dtype
    and latent width only: at K2.6's (512 + 64) sm_90 keeps 32 (float32) and 64 (bf16), sm_120 (99 KB) takes
    16 for float32 and keeps 64 for bf16; the demo's latent (64 + 16) keeps the widest everywhere; a latent
    no tile fits gives None (the launcher declines); the interpreter (no limit) the widest. The bound covers
    what Triton allocates (benchmarks/triton_resources.py --shapes)."""
    import torch

    from ddtree_chat.engine.ops import triton_mla_exact as ex

    sm90, sm120 = 227 * 1024, SM120_SHARED_PER_BLOCK
    assert [ex.block_n(d, 576, sm90) for d in (torch.float32, torch.bfloat16, torch.float16)] == [32, 64, 64]
    assert [ex.block_n(d, 576, sm120) for d in (torch.float32, torch.bfloat16, torch.float16)] == [16, 64, 64]
    assert [ex.block_n(d, 80, sm120) for d in (torch.float32, torch.bfloat16)] == [32, 64]
    assert ex.block_n(torch.bfloat16, 512 + 128, sm120) == 32 and ex.block_n(torch.float32, 1024 + 64, sm120) is None
    assert [ex.block_n(d, 576) for d in (torch.float32, torch.bfloat16)] == [32, 64]
    assert ex.shared_per_block(torch.device("cpu")) is None
    for d in (torch.float32, torch.bfloat16):  # every tile a whole number of times in a sub-chunk
        assert all(ex.SUB_KEYS % n == 0 for n in ex.BLOCK_NS[d])


def test_ffma_tiles_never_become_tensor_core_dots():
    """Triton (3.6, seen on the H200) turns a broadcast sum whose three sides are all >= 16 into a tensor-core
    dot in plain TF32 (7.7e-4 relative error): every tile the shape rule gives the FFMA form keeps a side
    under 16. And DDTREE_FMA_ROWS reads as documented."""
    from ddtree_chat.engine.ops import triton_linear as lin

    picked = 0
    for m in range(1, 65):
        for n in (4, 16, 128, 256, 768, 8192):
            for k in (32, 64, 128, 256, 1536):
                for plain in (True, False):
                    prec = lin._precision(m, n, k, plain)
                    if prec == "fma":
                        picked += 1
                        assert min(lin._tile(m, n, prec, min(k, lin.SPLIT_K_CHUNK))[:3]) < 16, (m, n, k)
    assert picked > 100
    assert lin._fma_rows("0") == range(0) and lin._fma_rows("2-48") == range(2, 49)
    with pytest.raises(ValueError, match="DDTREE_FMA_ROWS"):
        lin._fma_rows("sixteen")


@pytest.mark.parametrize("arch", [90, 120])
def test_kernels_launched_early_wait_for_the_kernel_before(arch):
    """With PDL (ops/pdl.py) each Triton kernel of the target's forward waits for the kernel before
    (griddepcontrol.wait) and lets the next launch, and a product with PREFETCH first bulk-prefetches its weight
    rows into L2 (the GLU form both weights'): compiled for sm_90 and sm_120. Without PDL none of it is there."""
    import sys
    from pathlib import Path

    import torch

    from ddtree_chat.engine.ops import triton_latent, triton_linear, triton_norm, triton_rope

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import triton_resources


    def mm(glu: bool, split: int, on: bool):
        return ASTSource(fn=triton_linear._mm_nt_kernel, signature=MM_BF16_SIGNATURE,
                         constexprs={"PREC": "tf32", "GLU": glu, "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64,
                                     "SPLIT": split, "NORM": False, "ROUTE": 0, "ADD": not glu, "M_INNER": True,
                                     "PDL": on, "PREFETCH": on})

    others = [ASTSource(fn=triton_norm._norm_kernel, signature=NORM_SIGNATURE,
                        constexprs={"D": 7168, "BLOCK": 8192, "HAS_RES": True, "PDL": True}),
              ASTSource(fn=triton_rope._rope_kernel, signature=ROPE_SIGNATURE,
                        constexprs={"HALF": 32, "BLOCK_D": 64, "INTERLEAVED": True, "BLOCK_R": 32, "NORM": False,
                                    "PDL": True}),
              ASTSource(fn=triton_latent._latent_kernel, signature=LATENT_SIGNATURE,
                        constexprs={"R": 512, "HALF": 32, "BLOCK_R": 512, "BLOCK_H": 32, "HAS_SLOTS": True,
                                    "PDL": True})]
    # the row-invariant MLA kernel and its merge
    mla = triton_resources.exact_mla_configs(dtypes=(torch.bfloat16,), heads=(8,), arch=arch, pdl=True)[:2]
    for src, prefetch in [(mm(True, 1, True), 2), (mm(False, 4, True), 1), *((s, 0) for s in others),
                          *((s, 0) for _, s, _ in mla)]:
        ptx = triton.compile(src, target=GPUTarget("cuda", arch, 32)).asm["ptx"]
        assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx, src.fn.__name__
        assert ptx.find("griddepcontrol.wait") < ptx.find("ld.global"), src.fn.__name__  # no read before the wait
        assert ptx.count("cp.async.bulk.prefetch.L2") == prefetch, src.fn.__name__
    ptx = triton.compile(mm(True, 1, False), target=GPUTarget("cuda", arch, 32)).asm["ptx"]
    assert "griddepcontrol" not in ptx and "prefetch" not in ptx


def test_pdl_is_a_gpu_launch_mode_and_prefetches_only_what_fits(monkeypatch):
    """DDTREE_PDL=1 changes nothing off CUDA (the launch arguments say off); a product prefetches its weights only
    where their rows are contiguous 16-byte multiples and all of them together fit PREFETCH_MAX_BYTES."""
    import torch

    from ddtree_chat.engine.ops import pdl

    monkeypatch.setenv("DDTREE_PDL", "1")
    w = torch.empty(1024, 7168, dtype=torch.bfloat16)
    assert pdl.launch(torch.device("cpu"), w) == {"PDL": False, "launch_pdl": False, "PREFETCH": False}
    assert pdl.launch(torch.device("cpu")) == {"PDL": False, "launch_pdl": False}
    assert pdl.prefetchable(w) and pdl.prefetchable(w[:512])
    assert not pdl.prefetchable(w.t())  # rows not contiguous along K
    assert not pdl.prefetchable(w[:, 4:])  # rows start 8 bytes into a 16-byte line
    half = torch.empty(pdl.PREFETCH_MAX_BYTES // (7168 * 2 * 2) + 1, 7168, dtype=torch.bfloat16)
    assert pdl.prefetchable(half)  # each of a GLU's two weights fits, both together do not:
    monkeypatch.setattr(pdl, "enabled", lambda device: True)
    big = torch.empty(pdl.PREFETCH_MAX_BYTES // (7168 * 2) + 1, 7168, dtype=torch.bfloat16)
    assert pdl.prefetchable(big) and pdl.launch(torch.device("cpu"), big)["PREFETCH"] is False  # alone too large
    assert pdl.launch(torch.device("cpu"), half, half)["PREFETCH"] is False
    assert pdl.launch(torch.device("cpu"), half, None)["PREFETCH"] is True
