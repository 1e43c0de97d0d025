"""ops/cpu_packed.py: the CPU's packed products against their twin F.linear, which weights get packed, and that a
loaded CPU engine's products take the packed path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ddtree_chat.engine import ops
from ddtree_chat.engine.ops import cpu_packed


def _flagged(n: int, k: int, dtype) -> torch.Tensor:
    w = torch.randn(n, k).to(dtype)
    cpu_packed.mark_tensor(w)
    assert cpu_packed.packable(w)
    return w


DTYPES = [d for d in (torch.float32, torch.bfloat16) if cpu_packed.available(d)]
pytestmark = pytest.mark.skipif(not DTYPES, reason="this torch build has no packed CPU product")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", [(8192, 384), (1152, 384), (384, 1152), (208, 384), (80, 64)])
def test_packed_product_matches_f_linear(dtype, n, k):
    torch.manual_seed(0)
    w = _flagged(n, k, dtype)
    tol = dict(rtol=1e-5, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    for m in (1, 3, 8, 9, 17, 33, 70):
        x = torch.randn(m, k).to(dtype)
        y = cpu_packed.linear(x, w)
        assert y.dtype == dtype and y.shape == (m, n)
        torch.testing.assert_close(y, F.linear(x, w), **tol)
    assert getattr(w, cpu_packed.PACKED, None) is not None  # packed once, on first use


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_ops_products_take_the_packed_form(dtype):
    """ops.linear, ops.linear_glu (through matmul_nt) and a strided input give F.linear's values with a flagged
    weight."""
    torch.manual_seed(1)
    wg, wu = _flagged(64, 32, dtype), _flagged(64, 32, dtype)
    x = torch.randn(2, 5, 32).to(dtype)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(ops.linear(x, wg), F.linear(x, wg), **tol)
    torch.testing.assert_close(ops.linear_glu(x, wg, wu), F.silu(F.linear(x, wg)) * F.linear(x, wu), **tol)
    xt = torch.randn(32, 7).to(dtype).t()  # not contiguous
    torch.testing.assert_close(ops.linear(xt, wg), F.linear(xt, wg), **tol)
    assert getattr(wu, cpu_packed.PACKED, None) is not None


@pytest.mark.skipif(not (cpu_packed._onednn(torch.float32) and cpu_packed._mkl()), reason="needs MKL and oneDNN")
def test_a_large_float32_weight_packs_for_onednn_a_small_one_for_mkl():
    """The lm head and the dense MLP (>= ONEDNN_MIN elements) take oneDNN's product at every row count, one row
    included; a small weight MKL's at 2+ rows and F.linear's (bit for bit) at one."""
    big, small = _flagged(8192, 384, torch.float32), _flagged(256, 384, torch.float32)
    assert big.numel() >= cpu_packed.ONEDNN_MIN > small.numel()
    for m in (1, 9):
        x = torch.randn(m, 384)
        torch.testing.assert_close(cpu_packed.linear(x, big), F.linear(x, big), rtol=1e-5, atol=1e-4)
        y = cpu_packed.linear(x, small)
        assert torch.equal(y, F.linear(x, small)) if m == 1 else torch.allclose(y, F.linear(x, small), atol=1e-4)
    assert getattr(big, cpu_packed.PACKED)[2] and not getattr(small, cpu_packed.PACKED)[2]


def test_a_weight_written_in_place_is_packed_again():
    w = _flagged(16, 8, DTYPES[0])
    x = torch.randn(3, 8).to(w.dtype)
    cpu_packed.linear(x, w)
    with torch.no_grad():
        w.mul_(2)
    torch.testing.assert_close(cpu_packed.linear(x, w), F.linear(x, w), rtol=1e-2, atol=1e-2)


def test_mark_flags_product_weights_not_embeddings(monkeypatch):
    model = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 4, bias=False), nn.LayerNorm(4))
    assert cpu_packed.mark(model) == 1
    assert cpu_packed.packable(model[1].weight)
    assert not cpu_packed.packable(model[0].weight) and not cpu_packed.packable(model[2].weight)
    monkeypatch.setenv("DDTREE_CPU_PACK", "0")
    other = nn.Linear(8, 4, bias=False)
    assert cpu_packed.mark(other) == 0 and not cpu_packed.packable(other.weight)


def test_a_cpu_engine_packs_its_products(engine):
    """A pair loaded on the CPU: the lm head (and the drafter's copy of it, in its own dtype) go through
    packed forms once a reply ran, a verify's routed experts run densely over packed stacked weights
    (ops/moe.py), and the reply still equals plain decoding's in ddtree mode."""
    from ddtree_chat.engine import GenerationConfig

    eng = engine
    head = eng.target.lm_head.weight
    assert cpu_packed.packable(head)
    ids = eng.tokenizer.encode("def add(a, b):")
    ar = list(eng.generate(ids, GenerationConfig(mode="ar", max_new_tokens=24)))[-1]["token_ids"]
    tree = list(eng.generate(ids, GenerationConfig(mode="ddtree", budget=16, max_new_tokens=24)))[-1]["token_ids"]
    assert tree == ar
    assert getattr(head, cpu_packed.PACKED, None) is not None
    experts = [layer.mlp.experts for layer in eng.target.layers if getattr(layer.mlp, "experts", None) is not None]
    assert experts and all(e.stacked is not None and e.stacked[1] is not None for e in experts)
    if eng.decoder.draft_head is not None:
        assert getattr(eng.decoder.draft_head, cpu_packed.PACKED, None) is not None


def test_a_cpu_without_the_bf16_reorder_keeps_f_linear_for_bf16(monkeypatch):
    """oneDNN's bf16 reorder raises on a CPU without AVX512 or AVX-NE-CONVERT (an AVX2 CPU): available() finds that
    out with one tiny product, and a bf16 weight is then never flagged (its products stay F.linear)."""
    def no_reorder(*a):
        raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert or avx512bw")

    cpu_packed.available.cache_clear()
    cpu_packed._onednn.cache_clear()
    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", no_reorder)
    try:
        assert not cpu_packed.available(torch.bfloat16)
        w = torch.randn(16, 8).to(torch.bfloat16)
        assert not cpu_packed.mark_tensor(w)
        x = torch.randn(3, 8).to(torch.bfloat16)
        assert torch.equal(cpu_packed.linear(x, w), F.linear(x, w))
    finally:
        cpu_packed.available.cache_clear()
        cpu_packed._onednn.cache_clear()
