import torch

from ddtree_chat.engine.ops.int4 import dequant_int4, pack_int4, quantize_int4, unpack_int4


def _pack_by_hand(codes: list[list[int]]) -> torch.Tensor:
    """An independent packer: element k -> word k // 8, bits 4*(k % 8), stored as q + 8."""
    rows = []
    for row in codes:
        words = []
        for w in range(len(row) // 8):
            v = 0
            for j in range(8):
                v |= (row[8 * w + j] + 8) << (4 * j)
            words.append(v - (1 << 32) if v >= 1 << 31 else v)
        rows.append(words)
    return torch.tensor(rows, dtype=torch.int32)


def test_unpack_matches_documented_bit_order():
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(-8, 8, (5, 64), generator=g)
    packed = _pack_by_hand(codes.tolist())
    assert torch.equal(unpack_int4(packed).long(), codes)
    assert torch.equal(pack_int4(codes), packed)


def test_lowest_nibble_first():
    # q = [-8, -7, ..., -1] -> nibbles 0..7, word 0x76543210
    packed = _pack_by_hand([list(range(-8, 0))])
    assert packed.item() == 0x76543210
    assert unpack_int4(packed).tolist() == [list(range(-8, 0))]


def test_dequant_uses_group_scales():
    codes = torch.full((2, 64), 3)
    scale = torch.tensor([[0.5, 2.0], [1.0, -1.0]])
    w = dequant_int4(pack_int4(codes), scale, 32)
    assert torch.allclose(w[0, :32], torch.full((32,), 1.5)) and torch.allclose(w[0, 32:], torch.full((32,), 6.0))
    assert torch.allclose(w[1, 32:], torch.full((32,), -3.0))


def test_quantize_roundtrip_error_is_bounded():
    w = torch.randn(16, 96, generator=torch.Generator().manual_seed(1))
    packed, scale = quantize_int4(w, 32)
    err = (dequant_int4(packed, scale, 32) - w).abs()
    assert (err <= scale.repeat_interleave(32, -1) / 2 + 1e-6).all()
