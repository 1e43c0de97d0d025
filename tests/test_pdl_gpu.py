"""Programmatic dependent launch on the GPU (DDTREE_PDL=1, ops/pdl.py): the target's Triton kernels launched
while the kernel before still runs give the bits they give launched one after another, eagerly and replayed
from a CUDA graph, at K2.6's real layer dimensions in bf16. A kernel that read before its wait would see a
predecessor's unfinished output: these comparisons are where that shows."""

import pytest
import torch

from ddtree_chat.engine.ops import pdl
from ddtree_chat.engine.ops.registry import strict

from drafters import closure_mask

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9, reason="needs CUDA, sm_90 or later")]

BF16 = torch.bfloat16


@pytest.fixture(autouse=True)
def no_silent_fallback():
    with strict():
        yield


@pytest.fixture(scope="module")
def k26():
    """K2.6 at its real layer dimensions, 2 layers (dense, then MoE with 64 of the 384 experts), bf16."""
    from ddtree_chat.engine.random_model import k26_config, random_target

    cfg = k26_config(layers=2, n_routed_experts=64)
    model = random_target(cfg, "cuda", BF16)
    model.fuse_projections()
    model.reserve_rope(2048, BF16)
    return cfg, model


def _forwards(cfg, model, graph: bool) -> list[torch.Tensor]:
    """A 300-token prompt in prefill chunks (256 + 44), a 17-node tree, then the AR step at the same place, each
    forward eager or (graph) recorded and replayed: their logits and the latent rows they wrote."""
    from ddtree_chat.engine.kv_cache import KVCache

    dev = torch.device("cuda")
    cache = KVCache(cfg.num_layers, 1024, cfg.kv_lora_rank, cfg.qk_rope_head_dim, BF16, dev)
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, cfg.vocab_size, (300,), generator=g).to(dev)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, 17)]
    tree = closure_mask(parents).to(dev)
    steps = [(prompt[:256], torch.arange(256, device=dev), torch.ones(256, 256, dtype=torch.bool, device=dev).tril()),
             (prompt[256:], torch.arange(256, 300, device=dev), torch.ones(44, 44, dtype=torch.bool, device=dev).tril()),
             (torch.randint(0, cfg.vocab_size, (17,), generator=g).to(dev), 300 + tree.sum(-1) - 1, tree),
             (prompt[:1], torch.tensor([300], device=dev), torch.ones(1, 1, dtype=torch.bool, device=dev))]
    out = []
    with torch.no_grad():
        for i, (toks, pos, mask) in enumerate(steps):
            at = cache.length
            cache.ensure_room(len(toks))

            def fwd():
                return model.logits(model(toks, pos, mask, cache)[0])

            logits = fwd()
            if graph:
                graph_ = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph_):
                    static = fwd()
                cache.ckv[:, at:].zero_()  # NOTE: the replay must write the rows again for them to compare
                cache.kpe[:, at:].zero_()
                graph_.replay()
                logits = static.clone()
            out += [logits, cache.ckv[:, at:at + len(toks)].clone(), cache.kpe[:, at:at + len(toks)].clone()]
            if i < 2:  # the prompt is committed; the tree and the AR step both follow it
                cache.advance(len(toks))
    return out


@pytest.mark.parametrize("graph", [False, True])
def test_forwards_give_the_same_bits_with_early_launches(k26, graph, monkeypatch):
    cfg, model = k26
    monkeypatch.setenv("DDTREE_PDL", "0")
    assert not pdl.enabled(torch.device("cuda"))
    want = _forwards(cfg, model, graph)
    monkeypatch.setenv("DDTREE_PDL", "1")
    assert pdl.enabled(torch.device("cuda"))
    got = _forwards(cfg, model, graph)
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), f"forward {i // 3}, {('logits', 'latent rows', 'rope rows')[i % 3]}"
