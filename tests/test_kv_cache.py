"""Cache owners: target commit/truncate, drafter context window."""

import pytest
import torch

from ddtree_chat.engine.errors import ContextLengthError
from ddtree_chat.engine.kv_cache import DraftCache, KVCache


def _kv(n, start, layers=2):
    # entry value = its position, so what the cache holds can be read back
    k = torch.arange(start, start + n, dtype=torch.float32).view(n, 1, 1).expand(n, 1, 2).clone()
    return torch.stack([k + 100 * i for i in range(layers)], 1), torch.stack([-k] * layers, 1)


def test_draft_cache_slides_its_window_and_truncates():
    c = DraftCache(2, 100, 1, 2, torch.float32, "cpu", window=5)
    c.append(*_kv(3, 0), 3)
    c.append(*_kv(4, 3), 7)  # 7 entries > window 5: the two oldest go
    k, v = c.layers()[1]
    assert c.length == 5 and k[:, 0, 0].tolist() == [102, 103, 104, 105, 106] and v[:, 0, 0].tolist() == [-2, -3, -4, -5, -6]
    c.truncate_to_pos(5)  # drop positions 5, 6
    assert c.layers()[0][0][:, 0, 0].tolist() == [2, 3, 4] and c.end_pos == 5
    c.append(*_kv(9, 5), 14)  # longer than the window at once: keep the newest 5
    assert c.layers()[0][0][:, 0, 0].tolist() == [9, 10, 11, 12, 13]


def test_target_cache_commit_compacts_and_guards_the_context():
    c = KVCache(1, 8, 2, 1, torch.float32, "cpu")
    ckv, kpe, at = c.destination(0, 5)
    assert at == 0 and ckv.shape == (8, 2) and kpe.shape == (8, 1)
    ckv[:5], kpe[:5] = torch.arange(5.0).view(5, 1), torch.arange(5.0).view(5, 1)
    c.commit([0, 2, 4])  # a tree's accepted nodes move to contiguous slots
    assert c.length == 3 and c.ckv[0, :3, 0].tolist() == [0, 2, 4] and c.kpe[0, :3, 0].tolist() == [0, 2, 4]
    with pytest.raises(ContextLengthError, match="context holds 8"):
        c.destination(0, 6)
    c.truncate(1)
    assert c.length == 1
