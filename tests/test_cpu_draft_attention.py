"""The drafter's attention on the CPU as one fused call (ops/cpu_draft_attention.py) against the einsum reference."""

import pytest
import torch

from ddtree_chat.engine.ops import cpu_draft_attention, draft_attention, draft_attention_ref


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("held", [None, 0, 1, 37, 300])
def test_fused_form_matches_the_reference(dtype, tol, held):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(8, 4, 64, generator=g).to(dtype)
    kc, vc = (torch.randn(320, 2, 64, generator=g).to(dtype) for _ in range(2))
    kb, vb = (torch.randn(8, 2, 64, generator=g).to(dtype) for _ in range(2))
    mask = None if held is None else torch.tensor([held])
    assert cpu_draft_attention.serves(q, mask)
    got = draft_attention(q, kc, vc, kb, vb, mask, 0.125)
    want = draft_attention_ref(q, kc, vc, kb, vb, mask, 0.125)
    assert got.shape == want.shape == (8, 4, 64) and got.dtype == dtype
    assert (got.float() - want.float()).abs().max() <= tol * want.float().abs().max()


def test_what_it_leaves_to_the_reference(monkeypatch):
    """A boolean mask (training's per-block masks), another device, or the form switched off: the reference."""
    q = torch.randn(8, 4, 64)
    assert not cpu_draft_attention.serves(q, torch.ones(8, 16, dtype=torch.bool))
    assert not cpu_draft_attention.serves(torch.empty(8, 4, 64, device="meta"), None)
    monkeypatch.setattr(cpu_draft_attention, "ENABLED", False)
    assert not cpu_draft_attention.serves(q, None)
