"""Pilot tests of the everyday chat features, the small things a newcomer notices, and a broken conversation
store, against the deterministic fake engine (fast, no model)."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from ui_fake_engine import FakeConfig, FakeEngine, fake_app, loaded, notes, reply, submit, wait_until  # noqa: E402

from ddtree_chat.history import History  # noqa: E402
from ddtree_chat.settings import Settings  # noqa: E402

pytestmark = pytest.mark.asyncio
SIZE = (120, 40)


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DDTREE_CHAT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def texts(app, selector: str) -> list[str]:
    return [str(w.render()) for w in app.query(selector)]


# -- 1. the context limit -------------------------------------------------------------------

async def test_long_chat_drops_oldest_turns_and_keeps_going():
    engine = FakeEngine(max_context=300)
    app = fake_app(engine, settings=Settings(system="Be brief.", max_new_tokens=40, thinking=False))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        questions = [f"question number {i}: " + "x" * 40 for i in range(8)]
        for q in questions:
            await reply(pilot, q)
        assert not notes(app, "error")
        assert sum("longer than the context" in n for n in notes(app)) == 1, "said once"
        system = engine.tokenizer.render_chat([{"role": "system", "content": "Be brief."}], add_generation_prompt=False)
        limit = 300 - (40 + 1)
        for prompt in engine.prompts:
            assert len(prompt) <= limit and prompt[:len(system)] == system, "fits with room for the reply, system kept"
        last_user = engine.tokenizer.render_chat([{"role": "user", "content": questions[-1]}], add_generation_prompt=False)
        assert engine.prompts[-1][-len(last_user) - 3:-3] == last_user, "the latest message is sent"
        first_user = engine.tokenizer.render_chat([{"role": "user", "content": questions[0]}], add_generation_prompt=False)
        assert engine.prompts[-1][len(system):len(system) + len(first_user)] != first_user, "the oldest turn is dropped"
        # A trim drops more than needed, so the next turn extends the kept prompt (the engine reuses its cache).
        opening = engine.tokenizer.render_chat([], add_generation_prompt=True, thinking=False)
        extends = [b[:len(a) - len(opening)] == a[:-len(opening)] for a, b in zip(engine.prompts, engine.prompts[1:])]
        assert extends.count(False) < len(extends) / 2
        assert all(m.content for m in app.session.messages), "no empty reply"
        status = str(app.query_one("#status-line").render())
        assert "/300 tokens" in status and "left out" in status
    saved = History.open().messages(app.session.conversation_id)
    assert [m.role for m in saved] == ["user", "assistant"] * len(questions)


async def test_message_longer_than_the_context_is_refused_and_kept():
    app = fake_app(FakeEngine(max_context=120), settings=Settings(max_new_tokens=20))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await submit(pilot, "y" * 200)
        assert any("too long for the context" in n for n in notes(app, "error"))
        assert app.query_one("#input").text == "y" * 200, "the message stays in the input"
        assert app.session.messages == [] and app.session.conversation_id is None and not app.generating
    assert History.open().conversations() == []


async def test_a_prompt_that_cannot_be_built_is_one_line_and_kept():
    engine = FakeEngine()

    def broken(*args, **kwargs):
        raise ValueError("no chat template")

    engine.tokenizer.render_chat = broken
    app = fake_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await submit(pilot, "hello")
        (line,) = notes(app, "error")
        assert "no chat template" in line and app.query_one("#input").text == "hello" and app.session.messages == []


class FailsOnce(FakeEngine):
    def __init__(self):
        super().__init__()
        self.failures = 1

    def generate(self, prompt_ids, cfg, stop=None):
        if self.failures:
            self.failures -= 1
            raise RuntimeError("device lost")
        yield from super().generate(prompt_ids, cfg, stop)


async def test_failed_reply_saves_nothing_empty_and_retry_recovers():
    app = fake_app(FailsOnce())
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await submit(pilot, "hello")
        await wait_until(pilot, lambda: not app.generating and notes(app, "error"))
        assert any("device lost" in n and "/retry" in n for n in notes(app, "error"))
        assert [m.role for m in app.session.messages] == ["user"] and not app.query("AssistantMessage")
        cid = app.session.conversation_id
        assert [m.role for m in History.open().messages(cid)] == ["user"], "no empty error reply saved"
        await submit(pilot, "/retry")
        await wait_until(pilot, lambda: len(app.session.messages) == 2 and not app.generating)
    assert [m.role for m in History.open().messages(cid)] == ["user", "assistant"]


# -- 2. /retry and /edit --------------------------------------------------------------------

async def test_retry_replaces_the_last_reply_in_view_and_database():
    engine = FakeEngine()
    app = fake_app(engine, settings=Settings(temperature=0.8, seed=5))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await reply(pilot, "hello")
        cid = app.session.conversation_id
        old = History.open().messages(cid)[1]
        await submit(pilot, "/retry")
        await wait_until(pilot, lambda: len(engine.prompts) == 2 and len(app.session.messages) == 2 and not app.generating)
        assert engine.prompts[1] == engine.prompts[0], "the same conversation is sent again"
        assert engine.configs[1].seed != 5, "a new sample at temperature > 0"
        assert len(app.query("AssistantMessage")) == 1 and len(app.query("UserMessage")) == 1
        saved = History.open().messages(cid)
        assert [m.role for m in saved] == ["user", "assistant"] and saved[1].id != old.id
        assert saved[1].meta["seed"] == engine.configs[1].seed


async def test_each_sampled_reply_draws_its_seed_keeps_it_and_shows_it():
    """The default seed ("random") draws a number per reply: stored with the reply and shown in its footer at
    T > 0, so /seed N repeats it; the conversation keeps "random"."""
    engine = FakeEngine()
    app = fake_app(engine, settings=Settings(temperature=0.8))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await reply(pilot, "hello")
        await reply(pilot, "again")
        seeds = [c.seed for c in engine.configs]
        assert all(isinstance(x, int) for x in seeds) and seeds[0] != seeds[1]
        assert f"seed {seeds[1]}" in str(app.query(".reply-footer").last().render())
        cid = app.session.conversation_id
    saved = History.open().messages(cid)
    assert [m.meta["seed"] for m in saved if m.role == "assistant"] == seeds
    assert History.open().get(cid).settings["seed"] == "random"


async def test_edit_resends_the_last_message_in_place_of_the_old_turn():
    engine = FakeEngine()
    app = fake_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await reply(pilot, "first")
        await reply(pilot, "second")
        await submit(pilot, "/edit")
        box = app.query_one("#input")
        assert box.text == "second"
        await pilot.press("escape")
        assert box.text == "" and not app._editing, "Esc cancels the edit"
        await submit(pilot, "/edit")
        await submit(pilot, "second, edited")
        await wait_until(pilot, lambda: len(app.session.messages) == 4 and not app.generating)
        assert texts(app, "UserMessage") == ["first", "second, edited"] and len(app.query("AssistantMessage")) == 2
        s = app.session
        expect = engine.tokenizer.render_chat(s.model_messages("", 0, s.messages[:3]), add_generation_prompt=True)
        assert engine.prompts[-1] == expect, "the old turn is not in the prompt"
        saved = History.open().messages(s.conversation_id)
        assert [m.content for m in saved if m.role == "user"] == ["first", "second, edited"] and len(saved) == 4


# -- 3. /copy ---------------------------------------------------------------------------------

CODE_REPLY = "The| quick|\n|`|`|`|\n| fox|\n| dog|\n|`|`|`|\n| lazy"


async def test_copy_reply_and_code_block_by_command_and_key():
    app = fake_app(FakeEngine(reply=CODE_REPLY), settings=Settings(thinking=False))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await submit(pilot, "/copy")
        assert app.clipboard == ""
        await reply(pilot, "code please")
        answer = app.session.messages[-1].content
        await pilot.press("ctrl+r")
        assert app.clipboard == answer
        await pilot.press("ctrl+b")
        assert app.clipboard == " fox\n dog"
        app.copy_to_clipboard("")
        await submit(pilot, "/copy code")
        assert app.clipboard == " fox\n dog"
        footer_keys = {b.key: b.description for b in app.BINDINGS if b.show}
        assert footer_keys["ctrl+r"] == "Copy reply" and footer_keys["ctrl+b"] == "Copy code"


# -- 4. recall --------------------------------------------------------------------------------

async def test_up_and_down_in_an_empty_input_recall_earlier_messages():
    app = fake_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await reply(pilot, "one")
        await reply(pilot, "two")
        box = app.query_one("#input")
        box.focus()
        seen = []
        for key in ("up", "up", "up", "down", "down"):
            await pilot.press(key)
            seen.append(box.text)
        assert seen == ["two", "one", "one", "two", ""]
        await pilot.press("a", "b", "up")
        assert box.text == "ab", "typed text is never replaced"


# -- 5. per-conversation settings --------------------------------------------------------------

async def test_conversation_keeps_its_settings_and_exports_them(home, tmp_path):
    app = fake_app(settings=Settings(thinking=False))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        for command in ("/system Answer like a pirate.", "/temp 0.7", "/top_p 0.9", "/repeat 1.3", "/max 33", "/budget 4",
                        "/seed 11", "/mode dflash"):
            await submit(pilot, command)
        await reply(pilot, "hello")
        assert (app.engine.configs[-1].top_p, app.engine.configs[-1].repeat_penalty) == (0.9, 1.3)
        cid = app.session.conversation_id
        wanted = dict(system="Answer like a pirate.", temperature=0.7, top_p=0.9, repeat_penalty=1.3, max_new_tokens=33,
                      budget=4, seed=11, mode="dflash")
        await pilot.press("ctrl+n")
        assert (app.settings.system, app.settings.temperature, app.settings.repeat_penalty) == ("", 0.0, 1.0), \
            "a new chat starts from the defaults"
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: type(app.screen).__name__ == "ConversationsScreen")
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.session.conversation_id == cid)
        await pilot.pause()
        assert {k: getattr(app.settings, k) for k in wanted} == wanted
        await submit(pilot, "/seed 12")  # a change in the open conversation is stored with it
        out = tmp_path / "chat.json"
        await submit(pilot, f"/export {out}")
    stored = History.open().get(cid).settings
    assert {k: stored[k] for k in wanted} == dict(wanted, seed=12)
    data = json.loads(out.read_text())
    assert data["settings"]["system"] == "Answer like a pirate." and data["settings"]["seed"] == 12
    assert data["settings"]["repeat_penalty"] == 1.3
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"]
    assert data["messages"][1]["stats"]["rounds"] > 0 and data["messages"][1]["stats"]["mode"] == "dflash"


async def test_continue_flags_open_a_conversation_in_the_chat():
    """`ddtree-chat -c` / `--conversation ID` without --prompt: the chat opens that conversation, its
    settings restored; an unknown id is one line and a fresh chat."""
    history = History.open()
    old = history.new_conversation("older", {"seed": 5})
    history.add_message(old, "user", "first question")
    cid = history.new_conversation("latest one", {"system": "Answer like a pirate.", "seed": 9, "repeat_penalty": 1.5})
    history.add_message(cid, "user", "what is a list?")
    history.add_message(cid, "assistant", "a sequence, arr")
    # the older one was saved before repeat_penalty existed: it gets the defaults' value
    for resume, want, seed, penalty in (("latest", cid, 9, 1.5), (old, old, 5, 1.2)):
        app = fake_app(settings=Settings(thinking=False, repeat_penalty=1.2), resume=resume)
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            await wait_until(pilot, lambda: app.session.conversation_id == want)
            assert (app.settings.seed, app.settings.repeat_penalty) == (seed, penalty)
    app = fake_app(settings=Settings(thinking=False), resume=12345)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await wait_until(pilot, lambda: any("no conversation 12345" in n for n in notes(app, "error")))
        assert app.session.conversation_id is None


# -- 6. export safety --------------------------------------------------------------------------

async def test_export_never_overwrites_or_creates_folders(tmp_path):
    app = fake_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await reply(pilot, "hello")
        existing = tmp_path / "kept.md"
        existing.write_text("mine")
        await submit(pilot, f"/export {existing}")
        await submit(pilot, f"/export {tmp_path / 'no' / 'such' / 'dir.md'}")
        errors = notes(app, "error")
        assert any("already exists" in e for e in errors) and any("does not exist" in e for e in errors)
        assert existing.read_text() == "mine" and not (tmp_path / "no").exists()
        assert all("\n" not in e for e in errors), "one line each"
        await submit(pilot, f"/export {tmp_path / 'new.md'}")
        assert (tmp_path / "new.md").read_text().startswith("# hello")


# -- 7. search, 8. delete ----------------------------------------------------------------------

async def test_conversation_list_searches_messages():
    h = History.open()
    for title, text in (("pets", "my brown fox escaped"), ("cooking", "how long to boil an egg"), ("more pets", "a lazy dog")):
        h.add_message(h.new_conversation(title), "user", text)
    app = fake_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: type(app.screen).__name__ == "ConversationsScreen")
        options = app.screen.query_one("OptionList")
        assert options.option_count == 3
        await pilot.press("slash", "e", "g", "g")
        await pilot.pause()
        assert options.option_count == 1 and "cooking" in str(options.get_option_at_index(0).prompt)
        assert "1 message " in str(options.get_option_at_index(0).prompt)
        await pilot.press("enter", "enter")
        await wait_until(pilot, lambda: app.session.title == "cooking")
        assert texts(app, "UserMessage") == ["how long to boil an egg"]


async def test_deleting_the_open_conversation_starts_a_fresh_chat():
    app = fake_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await reply(pilot, "hello")
        old = app.session.conversation_id
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: type(app.screen).__name__ == "ConversationsScreen")
        await pilot.press("d", "d", "escape")
        await pilot.pause()
        assert not app.query("UserMessage") and not app.query("AssistantMessage")
        assert app.session.conversation_id is None and app.session.messages == []
        assert any("deleted" in n for n in notes(app))
        await reply(pilot, "again")
        assert app.session.conversation_id not in (None, old)
    assert [c.title for c in History.open().conversations()] == ["again"]


# -- 9. layout ---------------------------------------------------------------------------------

async def test_narrow_window_moves_the_tree_panel_off_the_chat():
    app = fake_app()
    async with app.run_test(size=(90, 40)) as pilot:
        await loaded(pilot)
        await reply(pilot, "hello")
        panel, log = app.query_one("TreePanel"), app.query_one("#log")
        assert not panel.display and log.size.width >= 85, "the chat keeps the width"
        assert "ctrl+t" in str(app.query_one("#status-line").render())
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert panel.display and panel.region.y >= log.region.bottom, "shown below the chat"
        assert log.size.width >= 85
        await pilot.resize_terminal(130, 40)
        await pilot.pause()
        assert panel.display and panel.region.x >= log.region.right, "beside the chat again"


async def test_long_code_lines_wrap_and_page_keys_scroll_the_chat():
    from ddtree_chat.ui.chat_view import AssistantMessage

    app = fake_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        log = app.query_one("#log")
        long_line = "result = compute(" + ", ".join(f"arg{i}" for i in range(40)) + ")"
        await log.mount(AssistantMessage(False, f"```python\n{long_line}\n```"))
        for i in range(60):
            app.note(f"line {i}")
        await pilot.pause()
        fence = app.query_one("MarkdownFence")
        assert fence.max_scroll_x == 0 and fence.size.height >= 2, "wrapped, not cut"
        assert fence.region.y == fence.parent.region.y, "no blank lines above a reply that is code"
        log.scroll_end(animate=False)
        await pilot.pause()
        app.query_one("#input").focus()
        bottom = log.scroll_y
        await pilot.press("pageup")
        await pilot.pause()
        assert log.scroll_y < bottom and app.focused is app.query_one("#input")
        await pilot.press("pagedown")
        await pilot.pause()
        assert log.scroll_y == bottom


# -- 10. polish --------------------------------------------------------------------------------

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


def _slow_loading(app):
    """app whose engine factory waits for the returned event (the first start's kernel compiles)."""
    import threading

    gate = threading.Event()
    factory = app.engine_factory
    app.engine_factory = lambda progress: (gate.wait(10), factory(progress))[1]
    return gate


async def test_a_message_sent_while_loading_is_sent_once_the_model_is_ready():
    app = fake_app()
    gate = _slow_loading(app)
    async with app.run_test(size=SIZE) as pilot:
        box = app.query_one("#input")
        box.focus()
        box.text = "early"
        await pilot.press("enter", "!")
        await pilot.pause()
        assert box.text == "!" and app.session.messages == []  # waiting, and the next keys start a new input
        assert any("sent as soon as it is ready" in n for n in notes(app))
        box.text = "second"
        await pilot.press("enter")
        await pilot.pause()
        assert box.text == "second" and app._queued == "early"  # one waits at a time; the other stays
        gate.set()
        await loaded(pilot)
        await wait_until(pilot, lambda: len(app.session.messages) >= 2 and not app.generating)
        assert [m.role for m in app.session.messages] == ["user", "assistant"]
        assert app.session.messages[0].content == "early" and box.text == "second"


async def test_escape_takes_a_waiting_message_back_into_the_input():
    app = fake_app()
    gate = _slow_loading(app)
    async with app.run_test(size=SIZE) as pilot:
        await submit(pilot, "early")
        assert app.query_one("#input").text == ""
        await pilot.press("escape")
        await pilot.pause()
        assert app.query_one("#input").text == "early" and any("back in the input" in n for n in notes(app))
        gate.set()
        await loaded(pilot)
        await pilot.pause()
        assert app.session.messages == []  # taken back: nothing sent


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
        assert any("between 1 and 1023" in n for n in notes(app, "error"))
        await submit(pilot, "/budget 0")  # a ddtree round drafting nothing is not a valid round (--mode ar is)
        assert sum("between 1 and 1023" in n for n in notes(app, "error")) == 2 and app.settings.budget != 0
        await submit(pilot, "/budget 1")
        assert app.settings.budget == 1
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


async def test_auto_plain_steps_keep_the_last_tree_with_a_note():
    """--budget auto chose plain steps (rounds of mode ar): the panel keeps the last drafted tree under a note
    saying why none is drafted, instead of going blank; a drafted round replaces both."""
    from textual.app import App

    from ddtree_chat.ui.tree_panel import TreePanel

    tree = {"tokens": [5, 6, 7], "parents": [-1, 0, 0], "accepted_nodes": [0, 1]}
    drafted = {"mode": "ddtree", "budget": 2, "auto_budget": True, "tree": tree, "token_ids": [6, 8]}
    plain = {"mode": "ar", "budget": 0, "auto_budget": True, "tree": {"tokens": [9], "parents": [-1],
             "accepted_nodes": [0]}, "token_ids": [9]}

    class Host(App):
        def compose(self):
            yield TreePanel()

    async with Host().run_test(size=(60, 30)) as pilot:
        panel = pilot.app.query_one(TreePanel)
        panel.configure({}, lambda t: f"t{t}", "ddtree", None)
        panel.add_rounds([drafted, plain])
        await pilot.pause()
        view = str(pilot.app.query_one("#tree-view").render())
        assert "plain steps" in view and "t7" in view  # the note, and the last drafted tree (node 7)
        panel.add_rounds([drafted])
        await pilot.pause()
        view = str(pilot.app.query_one("#tree-view").render())
        assert "plain steps" not in view and "t7" in view
