"""data.py's data stage, made faster with the same bytes: the name weights found by bisection, the name-swapped
copies made by worker processes, the token streams joined by numpy and no stdlib chat pairs built for a distilled
data set, each against the per-token / serial / list form it replaced (the committed everyday set's answers)."""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from ddtree_chat.dev.demo import data, rename
from ddtree_chat.dev.demo.copy_probe import REQUESTED
from ddtree_chat.dev.demo.distil_data import PROMPTS, load_dataset, read_jsonl

ROOT = Path(__file__).resolve().parents[1]
EVERYDAY = ROOT / "training" / "demo-distil-everyday.tar.xz"
pytestmark = pytest.mark.skipif(not EVERYDAY.exists(), reason="committed data absent")


@pytest.fixture(scope="module")
def everyday(tmp_path_factory) -> Path:
    """The committed everyday set, unpacked (600 answers of 344 prompts, most of them named function requests)."""
    root = tmp_path_factory.mktemp("sets")
    with tarfile.open(EVERYDAY, "r:xz") as tf:
        for m in tf:
            if m.isfile():
                (root / m.name).parent.mkdir(parents=True, exist_ok=True)
                (root / m.name).write_bytes(tf.extractfile(m).read())
    return root / "everyday"


def _pairs_and_names(d: Path) -> tuple[list[tuple[str, str, str]], dict[str, str]]:
    pairs = [(r["id"], r["user"], r["answer"]) for r in load_dataset(d)[1]]
    return pairs, {p["id"]: p.get("name") for p in read_jsonl(d / PROMPTS) if p["kind"] == "function"}


def test_name_weights_by_bisection_equal_the_per_token_overlap(everyday):
    enc = data.Encoder(ROOT / "ddtree_chat" / "assets" / "demo" / "target")
    pairs, _ = _pairs_and_names(everyday)
    odd = [("u1", "Write a Python function größe(x) that returns x.", "```python\ndef größe(x):\n    return x\n```"),
           ("u2", "Write a Python function is_even(n) that tells.",
            "é😀 def  is_even  (n): ...\ndef is_evenx(n): ...\nasync def is_even(n):\n    return is_even(n)\n"
            "def is_even(m): pass"),
           ("u3", "Write a Python function f(x) that is short.", "def f(x): return 'é'\ndef f(")]
    pairs = pairs + odd
    seqs, prompts, masks = enc.encode_split([], pairs, with_masks=True, name_weight=4)
    heavy = 0
    for (_, u, a), ids, mask in zip(pairs, prompts, masks):
        # the form span_weights replaced: a pattern per requested name, every token against every def-line name
        asked = REQUESTED.search(u)
        names = [m.span(1) for m in re.finditer(rf"\bdef\s+({re.escape(asked.group(1))})\s*\(", a)] if asked else []
        offsets = enc.tok.encode(a, add_special_tokens=False).offsets
        want = [4 if any(lo < end and hi > start for start, end in names) else 1 for lo, hi in offsets]
        assert mask[len(ids[3]) + 1 : -1] == want, u
        heavy += want.count(4) > 0
    assert heavy > len(pairs) // 2  # most answers define the requested name
    # byte tokens of one character share its offsets; an empty token at a span's end is outside it
    assert data.span_weights([(0, 1), (1, 2), (1, 2), (2, 4), (4, 4), (4, 5)], [(1, 4)], 3) == [1, 3, 3, 3, 1, 1]


def test_name_swapped_copies_are_the_same_from_worker_processes(everyday):
    pairs, names = _pairs_and_names(everyday)
    serial = rename.rename_copies(pairs, names, 3, 7, "mixed", workers=1)
    assert len(serial) > len(pairs)
    assert rename.rename_copies(pairs, names, 3, 7, "mixed", workers=2, chunk=25) == serial
    assert rename.rename_copies(pairs, names, 3, 7, "mixed") == serial


def test_token_streams_joined_by_numpy_equal_the_list_form():
    lists = [[5, 255, 0], [], [7], list(range(200))]
    for dt, tdt in ((np.int16, torch.int16), (np.int32, torch.int32), (np.uint8, torch.uint8)):
        got, want = data.concat(lists, dt), torch.tensor([t for x in lists for t in x], dtype=tdt)
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_a_distilled_data_set_builds_no_stdlib_chat_pairs(everyday, tmp_path, monkeypatch):
    """A distilled set replaces the stdlib's docstring pairs, so they are not built (the slowest reading); the
    metadata keeps its keys in order (data_meta.json's bytes) and counts the distilled pairs."""
    full = data.read_sources(4)["meta"]

    def never(source):
        raise AssertionError("stdlib chat pairs built for a distilled data set")

    monkeypatch.setattr(data, "chat_pairs", never)
    meta = data.prepare(tmp_path, 4, log=lambda *a: None, distil=everyday, renames=1, name_weight=4)
    assert list(meta)[: len(full)] == list(full)
    assert json.loads((tmp_path / "data_meta.json").read_text())["split_chat_pairs"]["train"] > 0


def test_the_drafters_prompts_are_distinct_once_the_requests_cycle():
    """Fewer requests than prompts (the distilled case: ~8k fresh requests for a pool of 131k): each request is asked
    alone once, then only after an earlier exchange, so no prompt (and no greedy continuation) repeats; a later
    sample gives none of the earlier ones either."""
    import torch

    from ddtree_chat.dev.demo.data import Encoder
    from ddtree_chat.dev.demo.draft_data import PromptSynth
    from ddtree_chat.engine.default_model import shipped_demo_dirs

    target, _ = shipped_demo_dirs()
    enc = Encoder(Path(target))
    pairs = [(f"Write a Python function f{i}(x) that returns x plus {i}.", f"def f{i}(x):\n    return x + {i}")
             for i in range(300)]
    data = {"train_pairs": pairs, "streams": {"train": torch.arange(5000) % 500}}
    users = [f"Write a Python function g{i}(s) that reverses s." for i in range(10)]
    synth = PromptSynth(data, enc, seed=1, max_prompt=256, users=users, p_code=0.05, p_multi=0.4)
    first, later = synth.sample(200), synth.sample(100)
    keys = [tuple(p) for p in first + later]
    assert len(first) == 200 and len(later) == 100 and len(set(keys)) == 300
    alone = {tuple(p) for p in enc.requests(users)}
    assert sum(k in alone for k in keys) == len(users)  # every request asked alone exactly once
