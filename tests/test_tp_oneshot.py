"""The one-shot collectives without a GPU: the kernel compiles for sm_90 and sm_120 with the flag protocol's
system-scope release / acquire, the twin sums in rank order, and messages are cut into pieces and laid out
as the collective promises (the exchange itself faked by a twin that sees every rank's partial)."""

import re

import pytest
import torch

from ddtree_chat.engine.ops.triton_exchange import exchange_ref
from ddtree_chat.engine.parallel import oneshot_collectives as oneshot

EXCHANGE_SIGNATURE = {"X": "*bf16", "OUT": "*bf16", "DATA": "*i64", "FLAGS": "*i64", "EPOCHS": "*i32", "n": "i32",
                      "half": "i32", "out_stride": "i32", "RANK": "constexpr", "WORLD": "constexpr",
                      "BLOCK": "constexpr", "GATHER": "constexpr"}


@pytest.mark.parametrize("arch", [90, 120])
def test_the_exchange_kernel_compiles_with_system_scope_flags(arch):
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ddtree_chat.engine.ops import triton_exchange as tx

    for gather in (False, True):
        src = ASTSource(fn=tx._exchange_kernel, signature=EXCHANGE_SIGNATURE,
                        constexprs={"RANK": 1, "WORLD": 8, "BLOCK": tx.REGION_BYTES // 2, "GATHER": gather})
        ptx = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": 4}).asm["ptx"]
        # a release per peer's flag, an acquire per flag waited on; peers' partials read past the caches
        assert len(re.findall(r"atom\.global\.sys\.release\.exch", ptx)) == 8
        assert re.search(r"ld\.global\.sys\.acquire", ptx) and re.search(r"ld\.volatile\.global", ptx)


def test_the_twin_sums_in_rank_order_and_rounds_once():
    parts = [torch.tensor([1.0, 2.0**-8], dtype=torch.bfloat16), torch.tensor([2.0**-8, 1.0], dtype=torch.bfloat16),
             torch.tensor([2.0**-8, 2.0**-8], dtype=torch.bfloat16)]
    got = exchange_ref(parts, gather=False)
    # float32 accumulation: 1 + 2^-8 + 2^-8 = 1 + 2^-7, a bf16 value; adding in bf16 would round each 2^-8 away
    assert got.tolist() == [1.0078125, 1.0078125]
    assert torch.equal(exchange_ref(parts, gather=True), torch.stack(parts))


class _Peers:
    """Stands in for the kernel: each call sees the same slice of every rank's message."""

    def __init__(self, messages):
        self.messages = [m.contiguous().view(-1) for m in messages]
        self.calls = []

    def __call__(self, x, out, data_ptrs, flag_ptrs, epochs, half, rank, world, gather, out_stride=0):
        a = x.storage_offset()
        self.calls.append(x.numel() * x.element_size())
        assert x.numel() * x.element_size() <= half
        parts = [m[a : a + x.numel()] for m in self.messages]
        out.copy_(exchange_ref(parts, gather))


def _fake(monkeypatch, rank, messages, half):
    peers = _Peers(messages)
    monkeypatch.setattr(oneshot, "exchange", peers)
    one = object.__new__(oneshot.OneShot)
    one.rank, one.world, one.half = rank, len(messages), half
    one.data_ptrs = one.flag_ptrs = one.epochs = None
    return one, peers


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_messages_go_in_pieces_and_keep_their_layout(monkeypatch, dtype):
    g = torch.Generator().manual_seed(0)
    messages = [torch.randn(5, 7, 300, generator=g).to(dtype) for _ in range(3)]
    one, peers = _fake(monkeypatch, 1, messages, half=4096)
    got = one.all_reduce(messages[1])
    assert got.shape == messages[1].shape and len(peers.calls) > 1 and max(peers.calls) <= 4096
    want = exchange_ref([m.view(-1) for m in messages], gather=False).view(messages[1].shape)
    assert torch.equal(got, want)
    gathered = one.all_gather_last(messages[1])
    assert torch.equal(gathered, torch.cat(messages, dim=-1))
