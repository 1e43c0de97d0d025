"""The repeat penalty: each node is penalised from its own sequence (history + its path), so every mode still
emits plain decoding's tokens; the penalty itself follows llama.cpp's rule over the last window tokens."""

import pytest
import torch

from ddtree_chat.engine import Engine, GenerationConfig
from ddtree_chat.engine.repeat import RecentTokens, repeat_penalize
from ddtree_chat.engine.tree import DraftTree

from drafters import TargetDrafter


def _random_tree(n: int, vocab: int, g: torch.Generator) -> tuple[DraftTree, list[int]]:
    """A random tree of n nodes (parents before children, as rounds number them) and its parent list."""
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
    depth = [0] * n
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    tokens = torch.randint(0, vocab, (n,), generator=g)
    return DraftTree(tokens, torch.tensor(parents), torch.tensor(depth), torch.zeros(n)), parents


def _naive(logits, history, tokens, parents, penalty, window):
    """Node by node: its sequence is the history, then the tokens from the root down to it."""
    out = logits.clone()
    for i in range(len(tokens)):
        path, j = [], i
        while j >= 0:
            path.insert(0, tokens[j])
            j = parents[j]
        for tok in set((history + path)[-window:]):
            x = logits[i, tok]
            out[i, tok] = x / penalty if x > 0 else x * penalty
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("window,h", [(64, 40), (5, 10), (3, 0), (8, 8)])
def test_each_node_is_penalised_from_its_own_sequence(seed, window, h):
    g = torch.Generator().manual_seed(seed)
    n, v = 12, 20  # few tokens: repeats within paths and between history and paths
    tree, parents = _random_tree(n, v, g)
    history = torch.randint(0, v, (h,), generator=g)
    logits = torch.randn(n, v, generator=g) * 3
    got = repeat_penalize(logits, history, tree, 1.7, window)
    want = _naive(logits, history.tolist(), tree.tokens.tolist(), parents, 1.7, window)
    assert torch.equal(got, want)


def test_recent_tokens_hold_the_committed_window_by_position():
    """Written from the host, then rounds committed on the device: the history is always the last window tokens."""
    recent, seq = RecentTokens(8, torch.device("cpu")), list(range(100, 105))
    recent.write(seq)
    g = torch.Generator().manual_seed(0)
    for _ in range(12):
        n = 6
        tree, parents = _random_tree(n, 50, g)
        path, j = [], n - 1  # a path from the root down to the last node
        while j >= 0:
            path.insert(0, j)
            j = parents[j]
        accepted = torch.zeros(n, dtype=torch.bool)
        accepted[path] = True
        recent.commit(torch.tensor([len(seq)]), tree, accepted)
        seq += tree.tokens[path].tolist()
        history, skip = recent.history(torch.tensor([len(seq)]))
        assert int(skip) == 0 and history.tolist() == seq[-8:]
    short = RecentTokens(8, torch.device("cpu"))
    short.write([7, 8, 9])
    history, skip = short.history(torch.tensor([3]))
    assert int(skip) == 5 and history[5:].tolist() == [7, 8, 9]


def test_a_path_longer_than_the_window_writes_each_slot_once():
    """A 20-node accepted chain into an 8-token window: only its last 8 nodes are written, each slot once (two
    writes to one slot have no defined winner on a GPU; on the CPU the later one wins, so the slots are checked)."""
    class Spy(torch.Tensor):
        def scatter_(self, dim, index, src):
            Spy.index = index.clone()
            return super().scatter_(dim, index, src)

    recent = RecentTokens(8, torch.device("cpu"))
    recent.write([1, 2, 3])
    recent.ring = recent.ring.as_subclass(Spy)
    n = 20
    chain = DraftTree(torch.arange(100, 100 + n), torch.arange(-1, n - 1), torch.arange(n), torch.zeros(n))
    recent.commit(torch.tensor([3]), chain, torch.ones(n, dtype=torch.bool))
    written = Spy.index[Spy.index < 8]
    assert written.numel() == 8 and written.unique().numel() == 8
    history, skip = recent.history(torch.tensor([3 + n]))
    assert int(skip) == 0 and history.tolist() == list(range(100 + n - 8, 100 + n))


@pytest.fixture(scope="module")
def eng(synthetic_pair):
    return Engine.load(*synthetic_pair, device="cpu")


def _ids(eng, prompt, **kw):
    return list(eng.generate(prompt, GenerationConfig(stop_token_ids=(), max_new_tokens=40, **kw)))[-1]["token_ids"]


@pytest.mark.parametrize("noise", [0.0, 0.3])
def test_every_mode_emits_the_penalised_plain_decoding(eng, noise):
    """Drafts that follow the unpenalised greedy path (cut where noise says): the penalised target rejects
    some; ddtree, dflash and the auto budget still give ar's ids, which the penalty changed."""
    eng.decoder.block_logits = TargetDrafter(eng, noise=noise, seed=3)
    try:
        changed = False
        for text in ("def f(x):", "hello, world"):
            prompt = eng.tokenizer.encode(text)
            ar = _ids(eng, prompt, mode="ar", repeat_penalty=1.5)
            changed |= ar != _ids(eng, prompt, mode="ar")
            for kw in ({"mode": "ddtree", "budget": 16}, {"mode": "ddtree", "budget": 3}, {"mode": "dflash"},
                       {"mode": "ddtree", "budget": "auto"}):
                assert _ids(eng, prompt, repeat_penalty=1.5, **kw) == ar, kw
        assert changed
    finally:
        del eng.decoder.block_logits


def test_a_penalty_out_of_range_is_refused():
    for bad in (0.5, 0.99, 11.0, float("nan")):
        with pytest.raises(ValueError, match="repeat_penalty"):
            GenerationConfig(repeat_penalty=bad)
