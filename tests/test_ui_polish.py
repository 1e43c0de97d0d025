"""Pilot tests of the small things a newcomer notices, and of a broken conversation store (fake engine)."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from ui_fake_engine import FakeConfig, FakeEngine, fake_app, submit, wait_until  # noqa: E402

from ddtree_chat.history import History  # noqa: E402
from ddtree_chat.settings import Settings  # noqa: E402

pytestmark = pytest.mark.asyncio
SIZE = (120, 40)


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DDTREE_CHAT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


async def loaded(pilot):
    await wait_until(pilot, lambda: pilot.app.engine is not None)


async def reply(pilot, text: str):
    app = pilot.app
    before = len(app.session.messages)
    await submit(pilot, text)
    await wait_until(pilot, lambda: len(app.session.messages) >= before + 2 and not app.generating)
    await pilot.pause()


def notes(app, kind: str | None = None) -> list[str]:
    return [str(n.render()) for n in app.query(".note") if kind is None or n.has_class(kind)]


async def test_keys_typed_right_after_enter_start_a_new_input():
    app = fake_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        box = app.query_one("#input")
        box.focus()
        box.text = "/temp 0.5"
        await pilot.press("enter", "h", "i")
        await pilot.pause()
        assert app.settings.temperature == 0.5 and box.text == "hi"


async def test_a_message_sent_while_loading_stays_in_the_input():
    import threading

    gate = threading.Event()
    app = fake_app()
    factory = app.engine_factory
    app.engine_factory = lambda progress: (gate.wait(10), factory(progress))[1]
    async with app.run_test(size=SIZE) as pilot:
        box = app.query_one("#input")
        box.focus()
        box.text = "early"
        await pilot.press("enter", "!")
        await pilot.pause()
        assert box.text == "early!" and app.session.messages == []
        gate.set()
        await loaded(pilot)


async def test_new_chat_clears_the_tree_panel_and_stats():
    app = fake_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await reply(pilot, "hello")
        panel = app.query_one("TreePanel")
        assert panel.stats.rounds > 0 and panel.lengths
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert panel.stats.rounds == 0 and panel.stats.tokens == 0 and not panel.lengths and panel.last_round is None
        assert "waiting" in str(app.query_one("#tree-view").render())
        assert "rounds 0" in str(app.query_one("#tree-stats").render())
        assert app.query_one("#accept-spark").data == []


async def test_no_thinking_block_without_thinking_text():
    app = fake_app(FakeEngine(reply="</think>|The| quick| brown| fox", delay=0.05), settings=Settings(thinking=True))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await submit(pilot, "hi")
        reply_widget = None
        while app.generating or reply_widget is None:
            widgets = list(app.query("AssistantMessage"))
            reply_widget = widgets[-1] if widgets else None
            if reply_widget is not None:
                assert not reply_widget.query_one(".thinking").display, "no empty Thinking… block while streaming"
            await pilot.pause(0.02)
        await pilot.pause()
        assert not reply_widget.query_one(".thinking").display
        assert app.session.messages[-1].content == "The quick brown fox"


async def test_footer_and_panel_count_the_same_rounds():
    app = fake_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await reply(pilot, "hello")
        meta = app.session.messages[-1].meta
        panel = app.query_one("TreePanel")
        footer = str(app.query_one(".reply-footer").render())
        assert panel.stats.rounds == meta["rounds"] and f"{meta['rounds']} rounds" in footer
        assert f"rounds {meta['rounds']} " in str(app.query_one("#tree-stats").render())
        assert f"{meta['mean_accepted_length']:.2f} tokens/forward" in footer
        assert f"tok/fwd {meta['mean_accepted_length']:.2f}" in str(app.query_one("#tree-stats").render())
        assert len(app.query_one("DebugPane").rounds) == meta["rounds"]


async def test_budget_range_matches_the_cli():
    app = fake_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await submit(pilot, "/budget 5000")
        assert any("from 0 to 1023" in n for n in notes(app, "error"))
        await submit(pilot, "/budget 0")
        assert app.settings.budget == 0
        await submit(pilot, "/budget auto")
        assert app.settings.budget == "auto"


# -- 11. a broken store -----------------------------------------------------------------------

async def test_corrupt_database_one_line_and_the_chat_goes_on(home):
    db = home / "data" / "history.sqlite3"
    db.parent.mkdir(parents=True)
    db.write_bytes(b"not a database" * 200)
    app = fake_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        (line,) = notes(app, "error")
        assert "unreadable" in line and "\n" not in line
        await reply(pilot, "hello")
    assert [c.title for c in History.open().conversations()] == ["hello"]


@pytest.mark.parametrize("blocked", ["data", "state", "config"])
async def test_unusable_user_dir_one_line_and_the_chat_runs_without_it(home, blocked):
    from ddtree_chat.cli import build_parser
    from ddtree_chat.ui.startup import build_app

    home.mkdir(parents=True)
    (home / blocked).write_text("a file where a folder should be")
    app = build_app(build_parser().parse_args([]))
    engine = FakeEngine()
    app.engine_factory, app.config_cls = (lambda progress: engine), FakeConfig
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        errors = notes(app, "error")
        assert len(errors) == 1 and "\n" not in errors[0] and "Traceback" not in errors[0]
        await reply(pilot, "hello")
        assert app.session.messages[-1].content
        if blocked == "data":
            assert app.session.history is None
            out = home.parent / "unsaved.md"
            await submit(pilot, f"/export {out}")
            assert "hello" in out.read_text(), "an unsaved chat still exports"


async def test_database_from_a_newer_version_is_left_alone(home):
    db = home / "data" / "history.sqlite3"
    db.parent.mkdir(parents=True)
    conn = sqlite3.connect(str(db))
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    app = fake_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        (line,) = notes(app, "error")
        assert "newer ddtree-chat" in line and "not saved" in line
        await reply(pilot, "hello")
    assert sqlite3.connect(str(db)).execute("PRAGMA user_version").fetchone()[0] == 99


async def test_conversation_list_says_one_message():
    from ddtree_chat.history import Conversation
    from ddtree_chat.ui.conversations import describe

    assert " 1 message  ·" in describe(Conversation(1, "t", 0, 0, 1), None)
    assert " 2 messages  ·" in describe(Conversation(1, "t", 0, 0, 2), None)
