"""Unit tests of the UI's pure parts: think splitting, tree layout, update coalescing, commands."""

from __future__ import annotations

import io
import random
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from ui_fake_engine import FakeConfig, FakeEngine  # noqa: E402

from ddtree_chat.ui import commands  # noqa: E402
from ddtree_chat.ui.generation import GenerationDone, GenerationFailed, GenerationUpdate, run_generation  # noqa: E402
from ddtree_chat.ui.thinking import ThinkSplitter, split_text  # noqa: E402
from ddtree_chat.ui.tree_layout import layout, show_piece  # noqa: E402


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 100])
def test_think_split_any_chunking(chunk):
    text = "let me see</think>\n\nThe answer is <b>42</b>."
    s = ThinkSplitter(in_think=True)
    for i in range(0, len(text), chunk):
        s.feed(text[i:i + chunk])
    s.flush()
    assert s.thinking == "let me see" and s.answer == "The answer is <b>42</b>."


def test_think_split_without_thinking_and_unclosed():
    assert split_text("plain <think>hidden</think> shown", in_think=False) == ("hidden", "plain  shown")
    assert split_text("still thinking </thi", in_think=True) == ("still thinking </thi", "")


def random_tree(n: int, seed: int, accepted_depth: int) -> dict:
    rng = random.Random(seed)
    parents, depth, logp = [-1], [0], [0.0]
    path = [0]
    for _ in range(accepted_depth):
        parents.append(path[-1]); depth.append(depth[path[-1]] + 1); logp.append(-0.1); path.append(len(parents) - 1)
    while len(parents) < n:
        p = rng.randrange(len(parents))
        parents.append(p); depth.append(depth[p] + 1); logp.append(logp[p] - rng.random() * 3)
    return {"tokens": list(range(len(parents))), "parents": parents, "depth": depth, "accepted_nodes": path,
            "draft_logprobs": logp, "target_tokens": list(range(len(parents)))}


@pytest.mark.parametrize("n", [8, 16, 64, 256])
@pytest.mark.parametrize("max_lines", [12, 30])
def test_tree_layout_stays_readable(n, max_lines):
    tree = random_tree(n + 1, seed=n, accepted_depth=5)
    lines = layout(tree, lambda t: f"t{t}", max_lines=max_lines)
    assert len(lines) <= max_lines
    kinds = [line.kind for line in lines]
    assert kinds[0] == "root" and kinds.count("accepted") == 5 and "bonus" in kinds
    assert lines[-1].kind == "summary" and f"{n} drafted" in lines[-1].text
    # Every drafted node is either shown or counted somewhere.
    shown = sum(1 for line in lines if line.kind in ("root", "accepted", "rejected"))
    assert shown <= n + 1


def test_tree_layout_counts_hidden_nodes():
    tree = random_tree(40, seed=1, accepted_depth=2)
    lines = layout(tree, str, max_lines=100, max_siblings=1)
    more = [line for line in lines if line.kind == "more"]
    assert more and all(line.text.startswith("+") for line in more)


def test_tree_layout_empty_tree_and_pieces():
    assert layout({"tokens": []}, str)[0].kind == "summary"
    assert show_piece(" hello ") == "␣hello␣" and show_piece("\n") == "⏎" and show_piece("") == "∅"
    assert len(show_piece("x" * 50, 10)) == 10


def test_generation_updates_are_coalesced():
    engine = FakeEngine(repeat=50)  # 1000 tokens, a few hundred rounds, no delay
    posted = []
    run_generation(engine, [1, 2], FakeConfig(max_new_tokens=1000), threading.Event(), posted.append, gen_id=7, interval=0.05)
    updates = [m for m in posted if isinstance(m, GenerationUpdate)]
    assert isinstance(posted[-1], GenerationDone) and posted[-1].done["stop_reason"] in ("max_new_tokens", "stop_token")
    rounds = sum(1 for m in updates for ev in m.rounds if not ev.get("prefill"))
    assert rounds == posted[-1].done["rounds"] and len(updates) < rounds / 10
    assert "".join(m.text for m in updates) == posted[-1].done["text"]


def test_generation_failure_is_reported_not_raised():
    class Broken(FakeEngine):
        def generate(self, *a, **k):
            yield from ()
            raise RuntimeError("boom")

    posted = []
    run_generation(Broken(), [1], FakeConfig(), threading.Event(), posted.append, gen_id=1)
    assert isinstance(posted[-1], GenerationFailed) and "boom" in str(posted[-1].error)


def test_command_detection_and_help():
    assert commands.is_command("/temp 0.3") and commands.is_command("  /help")
    assert not commands.is_command("/usr/bin is a path") and not commands.is_command("hello /temp")
    from rich.console import Console

    console = Console(width=60, record=True, file=io.StringIO())
    console.print(commands.help_table())
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    text = "\n".join(lines)
    for name, _, _ in commands.COMMANDS:
        assert name in text
    assert "ctrl+j" in text and "esc" in text and "[ ] { }" in text
    # at 60 columns long descriptions wrap, and their later lines stay in the description column
    assert len(lines) > len(commands.COMMANDS) + len(commands.KEYS) + 2
    assert all(line.startswith("  ") for line in lines if line not in ("Commands:", "Keys:"))


def test_busy_ui_thread_gets_fewer_updates():
    def updates_with(ui_busy: bool) -> int:
        done = threading.Event()

        def ui():
            while not done.is_set():
                if ui_busy:
                    sum(range(10_000))  # burns CPU like a slow Markdown re-parse
                else:
                    time.sleep(0.01)

        t = threading.Thread(target=ui, daemon=True)
        t.start()
        posted = []
        engine = FakeEngine(repeat=20, delay=0.004)  # ~400 tokens in ~0.8 s
        run_generation(engine, [1], FakeConfig(max_new_tokens=400), threading.Event(), posted.append, 1, 0.05, t.ident)
        done.set()
        t.join()
        assert isinstance(posted[-1], GenerationDone)
        return sum(isinstance(m, GenerationUpdate) for m in posted)

    idle, busy = updates_with(False), updates_with(True)
    assert idle >= 8 and busy <= idle / 2


def test_device_label_says_where_and_how_rounds_run():
    from ddtree_chat.ui.tree_panel import device_label

    assert device_label({"device": "cpu", "tp": 1}) == "cpu"
    assert device_label({"device": "cuda:0", "tp": 1, "cuda_graphs": 29}) == "cuda:0 graphs"
    assert device_label({"device": "cuda:0", "tp": 8, "cuda_graphs": 0}) == "cuda:0 ×8"


def test_loading_label_names_the_step():
    from ddtree_chat.ui.loading import EngineProgress, loading_label

    assert loading_label(EngineProgress(3, 10, "layers.0.mlp.gate.weight")) == "Loading the model… 3/10 tensors"
    assert loading_label(EngineProgress(2, 18, "recording CUDA graphs", recording=True)).startswith(
        "Recording CUDA graphs… 2/18")
    label = loading_label(EngineProgress(5, 40, "compiling GPU kernels", compiling=True))
    assert label.startswith("Compiling GPU kernels… 5/40") and "first start only" in label


def test_code_blocks_of_a_reply():
    from ddtree_chat.ui.copying import code_blocks

    text = "a\n```py\none\n```\ntext ``` inline\n~~~\ntwo\n```\nstill two\n~~~\n````\nthree\n```\n````"
    assert code_blocks(text) == ["one", "two\n```\nstill two", "three\n```"]
    assert code_blocks("no code") == [] and code_blocks("```\nopen") == ["open"]


def test_recall_walks_like_a_shell_history():
    from ddtree_chat.ui.recall import Recall

    r, entries = Recall(), ["one", "two"]
    assert r.step(entries, "", 1) is None, "down in a fresh input does nothing"
    assert r.step(entries, "", -1) == "two" and r.step(entries, "two", -1) == "one" and r.step(entries, "one", -1) == "one"
    assert r.step(entries, "one", 1) == "two" and r.step(entries, "two", 1) == ""
    assert r.step(entries, "typed", -1) is None and r.step([], "", -1) is None
    r.step(entries, "", -1)
    assert r.step(entries, "two edited", -1) is None, "an edited recall is the user's text now"


def test_context_window_drops_whole_turns_with_slack():
    from ddtree_chat.ui.context import SLACK, reply_room, window

    roles = ["user", "assistant"] * 5 + ["user"]
    cost = [10] * len(roles)  # every message: 10 tokens

    def count(i):
        return sum(cost[i:])

    assert window(roles, 0, count, 200) == 0, "everything fits: nothing dropped"
    start = window(roles, 0, count, 100)
    assert roles[start] == "user" and count(start) <= 100 * (1 - SLACK) and count(start - 2) > 100 * (1 - SLACK)
    assert window(roles, start, count, 100) == start, "the window holds while it fits"
    assert window(roles, 0, count, 12) == 10, "no slack left: the last turn alone"
    assert window(roles, 0, count, 9) is None, "the last message alone is too long"
    assert reply_room(4096, 512) == 513 and reply_room(4096, 100_000) == 2049


def test_the_chat_says_when_the_random_model_stands_in(monkeypatch):
    """No --model and no demo pair installed: the chat's first lines say the replies will be gibberish."""
    from ddtree_chat.cli import build_parser
    from ddtree_chat.engine import default_model
    from ddtree_chat.ui.startup import build_app

    args = build_parser().parse_args(["--device", "cpu", "-c"])
    assert build_app(args)._resume == "latest"
    assert not any("random" in w for w in build_app(args)._startup_warnings)
    monkeypatch.setattr(default_model, "shipped_demo_dirs", lambda: None)
    assert any("tiny random model" in w for w in build_app(args)._startup_warnings)
