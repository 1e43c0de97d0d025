"""Pilot tests of the chat app against the real engine on a tiny synthetic K2.6-layout pair."""

from __future__ import annotations

import io
import json
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

sys.path.insert(0, str(Path(__file__).parent))
from ui_fake_engine import fake_app, notes, submit, wait_until  # noqa: E402

from ddtree_chat.history import History  # noqa: E402
from ddtree_chat.settings import Settings  # noqa: E402

pytestmark = pytest.mark.asyncio
SIZE = (120, 40)


@pytest.fixture(scope="session")
def pair(tmp_path_factory):
    from ddtree_chat.engine.synthetic import make_synthetic_pair

    return make_synthetic_pair(tmp_path_factory.mktemp("synthetic"), preset="tiny", seed=0)


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DDTREE_CHAT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def make_args(target, draft=None, **kw):
    from ddtree_chat.cli import build_parser

    args = build_parser().parse_args(["--model", str(target), "--device", "cpu"] + (["--draft", str(draft)] if draft else []))
    args.thinking = None  # NOTE: unset, so the settings under test decide
    for key, value in kw.items():
        setattr(args, key, value)
    return args


def real_app(pair, settings: Settings | None = None, **kw):
    from ddtree_chat.ui.app import DDTreeChatApp
    from ddtree_chat.ui.startup import engine_factory

    target, draft = pair
    return DDTreeChatApp(engine_factory(make_args(target, draft, **kw)), settings or Settings(thinking=False, max_new_tokens=24))


async def loaded(pilot):
    await wait_until(pilot, lambda: pilot.app.engine is not None, timeout=60)


async def reply(pilot, text: str, timeout: float = 60):
    before = len(pilot.app.session.messages)
    await submit(pilot, text)
    await wait_until(pilot, lambda: len(pilot.app.session.messages) >= before + 2 and not pilot.app.generating, timeout=timeout)
    await pilot.pause()


def reply_widgets(app):
    from ddtree_chat.ui.chat_view import AssistantMessage

    return list(app.query(AssistantMessage))


async def test_reply_streams_and_tree_panel_fills(pair, monkeypatch):
    from ddtree_chat.ui.app import DDTreeChatApp
    from ddtree_chat.ui.tree_panel import TreePanel

    app = real_app(pair, Settings(thinking=False, max_new_tokens=24, budget=16))  # NOTE: auto may pick plain steps
    updates = []
    original = DDTreeChatApp.on_generation_update

    async def spy(self, msg):
        updates.append(len(msg.rounds))
        await original(self, msg)

    monkeypatch.setattr(DDTreeChatApp, "on_generation_update", spy)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await reply(pilot, "hello")
        (widget,) = reply_widgets(app)
        answer = widget.splitter.answer
        assert answer.strip(), "the reply has text"
        assert updates, "the reply arrived in streamed updates"
        panel = app.query_one(TreePanel)
        assert panel.stats.rounds > 1 and panel.last_round is not None
        tree = panel.last_round["tree"]
        assert len(tree["tokens"]) > 1, "the last round drafted a tree"
        view = app.query_one("#tree-view").render()
        styles = {str(span.style) for span in view.spans}
        assert any("dim" in s for s in styles), "rejected nodes are dimmed"
        assert any("bold" in s for s in styles), "the accepted path is highlighted"
        assert str(view).count("✓") == len(tree["accepted_nodes"]) - 1
        assert any(v > 0 for v in app.query_one("#accept-spark").data)
        stats = str(app.query_one("#tree-stats").render())
        assert "ddtree" in stats and "cpu" in stats
    msgs = History.open().messages(app.session.conversation_id)
    assert [m.role for m in msgs] == ["user", "assistant"]
    assert msgs[1].content == answer.strip()
    assert msgs[1].meta["stop_reason"] in ("stop_token", "max_new_tokens")


class Paced:
    """The real engine, with a pause after each round so that Esc lands mid-reply on any CPU."""

    def __init__(self, engine, delay=0.03):
        self._engine, self._delay = engine, delay

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def generate(self, *args, **kwargs):
        for ev in self._engine.generate(*args, **kwargs):
            yield ev
            time.sleep(self._delay)


async def test_escape_stops_and_partial_reply_is_saved(pair):
    app = real_app(pair, Settings(thinking=False, max_new_tokens=3000))
    factory = app.engine_factory
    app.engine_factory = lambda progress: Paced(factory(progress))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await submit(pilot, "Tell me a story")
        await wait_until(pilot, lambda: app.query_one("TreePanel").stats.rounds >= 3, timeout=30)
        await pilot.press("escape")
        await wait_until(pilot, lambda: not app.generating, timeout=30)
        (widget,) = reply_widgets(app)
        shown = widget.splitter.answer.strip()
        assert "stopped" in str(widget.query_one(".reply-footer").render())
        cid = app.session.conversation_id
        # The engine keeps a consistent cache after a stop: the next turn works.
        await submit(pilot, "/max 16")
        await reply(pilot, "go on")
    msgs = History.open().messages(cid)
    assert msgs[1].meta["stop_reason"] == "stopped"
    assert msgs[1].content == shown and 0 < msgs[1].meta["tokens"] < 3000
    assert [m.role for m in msgs] == ["user", "assistant", "user", "assistant"]


async def test_debug_pane_toggles_and_steps(pair):
    from ddtree_chat.ui.debug_pane import DebugPane

    app = real_app(pair)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await reply(pilot, "hello")
        pane = app.query_one(DebugPane)
        assert not pane.display
        await pilot.press("f2")
        assert pane.display
        n = len(pane.rounds)
        assert n > 2 and pane.current == n - 1
        table = pane.query_one("DataTable")
        assert table.row_count == len(pane.rounds[-1]["tree"]["tokens"])
        assert f"{n}/{n}" in str(pane.query_one("#debug-header").render())
        await pilot.press("f3", "f3")
        assert pane.current == n - 3
        assert f"{n - 2}/{n}" in str(pane.query_one("#debug-header").render())
        assert table.row_count == len(pane.rounds[n - 3]["tree"]["tokens"])
        await pilot.press("f4")
        assert pane.current == n - 2
        table.focus()
        await pilot.press("left_square_bracket")
        assert pane.current == n - 3
        await pilot.press("right_curly_bracket")
        assert pane.current == n - 1 and pane.index is None
        await pilot.press("f2")
        assert not pane.display


async def test_slash_commands_change_settings(pair, home):
    app = real_app(pair)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        for command in ("/temp 0.5", "/top_p 0.9", "/repeat 1.2", "/max 7", "/budget 8", "/seed 3", "/think on",
                        "/system Be brief.", "/mode dflash"):
            await submit(pilot, command)
        s = app.settings
        assert (s.temperature, s.top_p, s.repeat_penalty, s.max_new_tokens, s.budget, s.seed, s.thinking, s.system,
                s.mode) == (0.5, 0.9, 1.2, 7, 8, 3, True, "Be brief.", "dflash")
        await submit(pilot, "/temp hot")
        await submit(pilot, "/repeat 0.5")
        notes = [str(n.render()) for n in app.query(".note")]
        assert any("temperature must be" in n for n in notes) and app.settings.temperature == 0.5
        assert "repeat_penalty must be from 1 to 10, not '0.5'." in notes and app.settings.repeat_penalty == 1.2
        await submit(pilot, "/repeat-penalty 1.4")
        await submit(pilot, "/settings")
        assert "repeat_penalty 1.4" in str(app.query(".note").last().render())
        await submit(pilot, "/repeat_penalty 1.1")
        assert app.settings.repeat_penalty == 1.1
        await submit(pilot, "/help")
        console = Console(width=100, record=True, file=io.StringIO())
        console.print(app.query(".note").last().content)  # the help's two-column table, as a terminal shows it
        help_note = console.export_text()
        assert "/export [PATH]" in help_note and "/repeat X" in help_note
        await submit(pilot, "/save")
        saved = json.loads((home / "config" / "settings.json").read_text())
        assert saved["budget"] == 8 and saved["mode"] == "dflash" and saved["repeat_penalty"] == 1.1
        await submit(pilot, "/mode ar")
        await submit(pilot, "/think off")
        await reply(pilot, "hello")
        done_tokens = app.session.messages[-1].meta["tokens"]
        assert done_tokens <= 7 and app.session.messages[-1].meta["mode"] == "ar"
        # The palette offers the same settings.
        titles = {c.title: c for c in app.get_system_commands(app.screen)}
        titles["Mode: ddtree"].callback()
        assert app.settings.mode == "ddtree"
        titles["Set repeat penalty…"].callback()
        assert app.query_one("#input").text == "/repeat "


async def test_conversation_survives_restart_and_exports(pair, tmp_path):
    app = real_app(pair)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await reply(pilot, "first question")
        first = app.session.messages[-1].content
    app2 = real_app(pair)
    async with app2.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: type(app2.screen).__name__ == "ConversationsScreen", timeout=5)
        await pilot.press("enter")
        await wait_until(pilot, lambda: app2.session.conversation_id is not None, timeout=5)
        await pilot.pause()
        assert [m.content for m in app2.session.messages] == ["first question", first]
        assert [str(w.render()) for w in app2.query(".user")] == ["first question"]
        out = tmp_path / "chat.md"
        await submit(pilot, f"/export {out}")
        text = out.read_text()
        assert "first question" in text and first.splitlines()[0][:20] in text
        await submit(pilot, "/export")
        assert list((tmp_path / "home" / "data" / "exports").glob("*.md"))
        # Resuming continues the same conversation.
        await reply(pilot, "second question")
        assert len(History.open().messages(app2.session.conversation_id)) == 4
        # Rename it, then delete it from the list (a single press only arms the delete).
        await submit(pilot, "/rename kept title")
        assert History.open().get(app2.session.conversation_id).title == "kept title"
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: type(app2.screen).__name__ == "ConversationsScreen", timeout=5)
        await pilot.press("d")
        await pilot.pause()
        assert len(History.open().conversations()) == 1
        await pilot.press("d")
        await pilot.press("escape")
    assert History.open().conversations() == []


async def test_bad_model_path_shows_error_screen(tmp_path, home):
    from ddtree_chat.ui.app import DDTreeChatApp
    from ddtree_chat.ui.startup import engine_factory

    app = DDTreeChatApp(engine_factory(make_args(tmp_path / "no-such-model")))
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: type(app.screen).__name__ == "ErrorScreen" and app.screen.query("#error-message"), timeout=30)
        message = str(app.screen.query_one("#error-message").render())
        assert "no-such-model" in message and "Traceback" not in message
        await pilot.press("q")
    assert app.return_code == 1
    assert "Traceback" in (home / "state" / "ddtree-chat.log").read_text()


async def test_cli_arguments_reach_the_app(pair, home):
    from ddtree_chat import settings as settings_mod
    from ddtree_chat.cli import build_parser
    from ddtree_chat.ui.startup import build_app

    settings_mod.save(Settings(budget=8, thinking=True, max_new_tokens=99))
    target, draft = pair
    args = build_parser().parse_args(["--model", str(target), "--draft", str(draft), "--device", "cpu", "--temperature", "0.5",
                                      "--no-think", "--max-new-tokens", "12", "--mode", "dflash"])
    app = build_app(args)
    s = app.settings
    assert (s.budget, s.thinking, s.max_new_tokens, s.temperature, s.mode) == (8, False, 12, 0.5, "dflash")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await reply(pilot, "hi")
        assert app.session.messages[-1].meta["mode"] == "dflash"
        assert app.session.messages[-1].meta["tokens"] <= 12



async def test_the_demo_pair_says_what_it_is_once_loaded(home):
    """With no --model (the shipped demo pair) the chat says, after the load's note, that the demo is a small code
    model there to show the engine; with a model, or the random stand-in (it has its own warning), it does not."""
    from ddtree_chat.cli import build_parser
    from ddtree_chat.engine.default_model import shipped_demo_dirs
    from ddtree_chat.ui.startup import DEMO_INTRO, build_app

    demo = build_app(build_parser().parse_args(["--device", "cpu"]))
    assert demo._intro == (DEMO_INTRO if shipped_demo_dirs() is not None else "")
    assert build_app(build_parser().parse_args(["--model", "some-dir", "--device", "cpu"]))._intro == ""
    app = fake_app(intro=DEMO_INTRO)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        shown = notes(app)
        assert shown[-1] == DEMO_INTRO and shown[-2].startswith("Loaded ")
