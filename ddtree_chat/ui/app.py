"""The Textual chat app: wiring of the conversation, the tree panel, the debug pane and the engine.

Entry point for the CLI's interactive mode: `run_app(args) -> int`.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import sqlite3
import threading
import time
from pathlib import Path
from typing import Callable

from rich.console import RenderableType
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Footer, Header, Label, ProgressBar, Static

from ddtree_chat import logs, paths
from ddtree_chat import settings as settings_mod
from ddtree_chat.modes import MODES, Mode
from ddtree_chat.history import Conversation, History, Message
from ddtree_chat.settings import Settings, SettingsError
from ddtree_chat.ui import commands, export
from ddtree_chat.ui.chat_view import AssistantMessage, ChatInput, Note, UserMessage
from ddtree_chat.ui.context import reply_room, window
from ddtree_chat.ui.conversations import ConversationDeleted, ConversationsScreen
from ddtree_chat.ui.copying import code_blocks
from ddtree_chat.ui.debug_pane import DebugPane
from ddtree_chat.ui.generation import UPDATE_INTERVAL, GenerationDone, GenerationFailed, GenerationUpdate, run_generation
from ddtree_chat.ui.loading import (EngineFailed, EngineProgress, EngineReady, ErrorScreen, describe_error, loading_label,
                                    start_loading)
from ddtree_chat.ui.replies import footer_for, meta_for
from ddtree_chat.ui.tree_panel import TreePanel

log = logging.getLogger("ddtree_chat.ui")

NARROW = 110  # columns: below this the tree panel leaves the side of the chat (hidden; ctrl+t shows it below)


class DDTreeChatApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "ddtree-chat"
    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("f2", "toggle_debug", "Debug pane"),
        Binding("f3", "debug_step(-1)", "Prev round", show=False),
        Binding("f4", "debug_step(1)", "Next round", show=False),
        Binding("ctrl+n", "new_chat", "New chat"),
        Binding("ctrl+o", "conversations", "Chats"),
        Binding("ctrl+r", "copy_reply", "Copy reply"),
        Binding("ctrl+b", "copy_code", "Copy code"),
        Binding("ctrl+t", "toggle_tree", "Tree panel", show=False),
    ]

    def __init__(self, engine_factory: Callable, settings: Settings | None = None, *, warnings: list[str] | None = None,
                 history: History | None = None, open_history: bool = True, config_cls=None, model_label: str = "",
                 resume: int | str | None = None, intro: str = ""):
        """resume: a conversation id to open once the model is loaded, or "latest" (the CLI's -c); intro: a note
        after the load's (what the model is)."""
        super().__init__()
        self._resume, self._intro = resume, intro
        self._startup_warnings = list(warnings or [])
        log_warning = logs.setup_logging()
        if log_warning:
            self._startup_warnings.append(log_warning)
        self.engine_factory = engine_factory
        self.settings = settings or Settings()
        self.base_settings = self.settings  # what a new chat starts with (startup values, then /save)
        self.engine = None
        self.config_cls = config_cls
        self.model_label = model_label
        if history is None and open_history:
            history = self._open_history()
        if history is not None and history.warning:
            self._startup_warnings.append(history.warning)
        from ddtree_chat.ui.session import ChatSession

        self.session = ChatSession(history, lambda text: self.note(text, "error"))
        self._gen_id = 0
        self._stop: threading.Event | None = None
        self._reply: AssistantMessage | None = None
        self._reply_settings = self.settings  # the settings the reply in progress was asked with
        self._prompt_tokens = 0
        self._meter = ""
        self._editing = False
        self._queued: str | None = None  # a message sent while the model loads: sent once it is ready
        self._tree_shown = {False: True, True: False}  # by narrow layout: shown beside a wide chat, hidden under a narrow one
        self.exit_code = 0
        self.update_interval = UPDATE_INTERVAL

    def _open_history(self) -> History | None:
        try:
            return History.open()
        except (sqlite3.Error, OSError) as err:
            log.exception("opening the conversation database failed")
            reason = getattr(err, "strerror", None) or str(err)
            where = f" ({err.filename})" if getattr(err, "filename", None) else ""
            self._startup_warnings.append(f"Conversations are not saved in this session: {reason}{where}.")
            return None

    # -- layout ----------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            with Vertical(id="chat-column"):
                with Vertical(id="loading"):
                    yield Label("Loading the model…", id="loading-label")
                    yield ProgressBar(id="loading-bar", show_eta=False)
                yield VerticalScroll(id="log")
                yield ChatInput(id="input", placeholder="Message (enter sends, ctrl+j newline, /help for commands)")
                yield Static("", id="status-line", markup=False)
            yield TreePanel(id="tree-panel")
        yield DebugPane(id="debug-pane")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self.model_label
        log_widget = self.query_one("#log", VerticalScroll)
        log_widget.anchor()  # follow the stream until the user scrolls up
        self.query_one(DebugPane).display = False
        for warning in self._startup_warnings:
            self.note(warning, "error")
        box = self.query_one(ChatInput)
        box.entries = lambda: [m.content for m in self.session.messages if m.role == "user"]
        box.focus()
        self._layout(self.size.width)
        start_loading(self.engine_factory, self.post_message)

    def on_resize(self, event) -> None:
        self._layout(event.size.width)

    def _layout(self, width: int) -> None:
        narrow = width < NARROW
        self.query_one("#main").set_class(narrow, "narrow")
        self.query_one(TreePanel).display = self._tree_shown[narrow]
        self._render_status()

    def get_system_commands(self, screen):
        yield from super().get_system_commands(screen)
        yield from commands.palette_commands(self)

    # -- engine loading --------------------------------------------------------------------

    def on_engine_progress(self, msg: EngineProgress) -> None:
        self.query_one("#loading-bar", ProgressBar).update(total=max(msg.total, 1), progress=msg.done)
        self.query_one("#loading-label", Label).update(loading_label(msg))

    def on_engine_ready(self, msg: EngineReady) -> None:
        self.engine = msg.engine
        info = dict(getattr(msg.engine, "info", {}) or {})
        log.info("model loaded in %.1f s: %s", msg.seconds, info)
        self.query_one("#loading").display = False
        self.settings, self.base_settings = self._usable(self.settings), self._usable(self.base_settings)
        self.sub_title = f"{info.get('model', self.model_label)} · {info.get('device', '?')}"
        panel = self.query_one(TreePanel)
        panel.configure(info, self.piece, self.settings.mode, self.settings.budget)
        drafter = "with drafter" if info.get("has_drafter") else "no drafter (ar only)"
        self.note(f"Loaded {info.get('model', 'model')} on {info.get('device', '?')}, {drafter}. Type /help for commands.")
        if self._intro:
            self.note(self._intro)
        self._show_context()
        if self._resume is not None:
            self.call_after_refresh(self._resume_conversation)
        if self._queued is not None:
            self.call_after_refresh(self._send_queued)

    async def _send_queued(self) -> None:
        text, self._queued = self._queued, None
        if text is not None:  # NOTE: Esc may have taken it back meanwhile
            await self.send(text)

    async def _resume_conversation(self) -> None:
        """-c / --conversation ID: the chat opens where that conversation ended."""
        wanted, self._resume = self._resume, None
        history = self.session.history
        found = history.conversations()[:1] if history is not None and wanted == "latest" else []
        if history is not None and wanted != "latest":
            found = [c for c in [history.get(wanted)] if c is not None]
        if not found:
            self.note("No conversation to continue; this is a new chat." if wanted == "latest"
                      else f"There is no conversation {wanted} (ctrl+o lists them); this is a new chat.", "error")
            return
        await self._on_conversation_choice(("open", found[0].id))

    def on_engine_failed(self, msg: EngineFailed) -> None:
        self.exit_code = 1
        self._take_back_queued()
        self.push_screen(ErrorScreen("Could not load the model", msg.message))

    def _usable(self, s: Settings) -> Settings:
        """`s` with a mode this model can run (none set, or one that needs the missing drafter: the default)."""
        if s.mode is None or s.mode not in self.modes:
            return s.replace(mode=Mode.DDTREE.value if Mode.DDTREE in self.modes else Mode.AR.value)
        return s

    @property
    def modes(self) -> list[str]:
        if self.engine is None:
            return list(MODES)
        info = getattr(self.engine, "info", {}) or {}
        return list(info.get("modes") or (MODES if info.get("has_drafter") else [Mode.AR.value]))

    @property
    def max_context(self) -> int:
        return int((getattr(self.engine, "info", {}) or {}).get("max_context") or 4096)

    def piece(self, token_id: int) -> str:
        try:
            return self.engine.tokenizer.piece(int(token_id))
        except Exception:  # noqa: BLE001 - a display helper must never break the UI
            return f"<{token_id}>"

    # -- chat ------------------------------------------------------------------------------

    def note(self, text: RenderableType, kind: str = "info") -> None:
        self.query_one("#log", VerticalScroll).mount(Note(text, kind))

    def prefill(self, text: str) -> None:
        box = self.query_one(ChatInput)
        box.text = text
        box.move_cursor(box.document.end)
        box.focus()

    @property
    def generating(self) -> bool:
        return self._reply is not None

    async def on_chat_input_submitted(self, msg: ChatInput.Submitted) -> None:
        box = self.query_one(ChatInput)
        if commands.is_command(msg.text):
            commands.run_command(self, msg.text)
            return
        if self.engine is None:
            if self._queued is not None:
                box.give_back(msg.text)
                self.notify("A message is already waiting for the model; Esc takes it back.", severity="warning")
                return
            self._queued = msg.text.strip("\n")
            self.note("The model is still loading: your message is sent as soon as it is ready (Esc takes it back).")
            return
        if self.generating:
            box.give_back(msg.text)
            self.notify("A reply is still being written; press Esc to stop it.", severity="warning")
            return
        await self.send(msg.text.strip("\n"))

    def _fit(self, messages: list[Message]) -> tuple[int, list[int]] | None:
        """(first message the model sees, prompt ids) for a reply to messages[-1], dropping the oldest turns
        when the whole history does not fit the context with room for the reply; None when the last
        message alone does not fit or the prompt cannot be built (a note says why)."""
        try:
            return self._fit_or_raise(messages)
        except Exception as err:  # noqa: BLE001 - e.g. a tokenizer error: one line, the message stays in the input
            log.exception("preparing the prompt failed")
            self.note(describe_error(err).replace("while loading the model", "while preparing the prompt"), "error")
            return None

    def _fit_or_raise(self, messages: list[Message]) -> tuple[int, list[int]] | None:
        s, tok = self.settings, self.engine.tokenizer
        rendered: dict[int, list[int]] = {}

        def prompt(i: int) -> list[int]:
            if i not in rendered:
                rendered[i] = tok.render_chat(self.session.model_messages(s.system, i, messages), add_generation_prompt=True,
                                              thinking=s.thinking)
            return rendered[i]

        total = self.max_context
        limit = total - reply_room(total, s.max_new_tokens)
        start = window([m.role for m in messages], min(self.session.window, len(messages) - 1), lambda i: len(prompt(i)), limit)
        if start is None:
            self.note(f"This message is too long for the context: the prompt needs {len(prompt(len(messages) - 1)):,} "
                      f"tokens, the context holds {total:,} with {total - limit:,} kept for the reply (lower /max, or "
                      "shorten the message or the system prompt).", "error")
            return None
        if start > self.session.window and not self.session.trim_noted:
            self.session.trim_noted = True
            self.note(f"The conversation is longer than the context ({total:,} tokens): the oldest turns are left out of "
                      "what the model sees from now on (they stay here and in the saved chat).")
        return start, prompt(start)

    async def send(self, text: str) -> None:
        box = self.query_one(ChatInput)
        before = self.session.messages
        if self._editing:
            before = before[:self._last_user_index()]
        fitted = self._fit(before + [Message("user", text)])
        if fitted is None:
            box.give_back(text)
            return
        if self._editing:
            self._editing = False
            self.session.drop_last_turn()
            await self._remove_last_turn()
        start, prompt = fitted
        self.session.add_user(text, dataclasses.asdict(self.settings))
        self.session.window = start
        await self.query_one("#log", VerticalScroll).mount(UserMessage(text))
        await self._generate(prompt)

    async def _generate(self, prompt: list[int], seed: int | None = None) -> None:
        s = self.settings.replace(seed=seed) if seed is not None else settings_mod.with_seed(self.settings)
        log_widget = self.query_one("#log", VerticalScroll)
        config = self._config_cls()(mode=s.mode, budget=s.budget, temperature=s.temperature, top_p=s.top_p,
                                    repeat_penalty=s.repeat_penalty, seed=s.seed, max_new_tokens=s.max_new_tokens)
        self._reply = AssistantMessage(in_think=s.thinking)
        self._reply_settings = s
        await log_widget.mount(self._reply)
        log_widget.anchor()
        self._prompt_tokens = len(prompt)
        self._show_context(len(prompt))
        self.query_one(TreePanel).start_reply(s.mode, s.budget)
        self.query_one(DebugPane).reset(self.piece)
        self._gen_id += 1
        self._stop = threading.Event()
        engine, stop, gen_id = self.engine, self._stop, self._gen_id
        interval, ui_thread = self.update_interval, threading.get_ident()
        self.run_worker(lambda: run_generation(engine, prompt, config, stop, self.post_message, gen_id, interval, ui_thread),
                        thread=True, group="generation", name="generate")

    def _config_cls(self):
        if self.config_cls is None:
            from ddtree_chat.engine import GenerationConfig

            self.config_cls = GenerationConfig
        return self.config_cls

    async def on_generation_update(self, msg: GenerationUpdate) -> None:
        if msg.gen_id != self._gen_id or self._reply is None:
            return
        panel = self.query_one(TreePanel)
        panel.add_rounds(msg.rounds)
        self.query_one(DebugPane).add_rounds(msg.rounds)
        self._show_context(self._prompt_tokens + panel.stats.tokens)
        await self._reply.append(msg.text)

    async def on_generation_done(self, msg: GenerationDone) -> None:
        if msg.gen_id != self._gen_id or self._reply is None:
            return
        self.query_one(TreePanel).finish(msg.done)
        meta = meta_for(msg.done, self._reply_settings)
        self._show_context(self._prompt_tokens + int(meta["tokens"]))
        await self._finish_reply(msg.done.get("text"), footer_for(meta), meta)

    async def on_generation_failed(self, msg: GenerationFailed) -> None:
        if msg.gen_id != self._gen_id or self._reply is None:
            return
        text = describe_error(msg.error).replace("while loading the model", "while generating")
        if msg.text.strip():
            await self._finish_reply(msg.text, "error", {"stop_reason": "error", "error": text})
        else:  # nothing was generated: no empty reply is shown or saved (/retry tries again)
            reply, self._reply, self._stop = self._reply, None, None
            await reply.remove()
        self.note(f"{text} (/retry tries again.)", "error")

    async def _finish_reply(self, full_text: str | None, footer: str, meta: dict) -> None:
        reply, self._reply, self._stop = self._reply, None, None
        thinking, answer = await reply.finish(footer, full_text)
        self.session.add_assistant(answer, thinking, meta)

    def action_stop(self) -> None:
        if self._stop is not None:
            self._stop.set()
        elif self._queued is not None:
            self._take_back_queued()
            self.note("Not sent: your message is back in the input.")
        elif self._editing:
            self._editing = False
            self.query_one(ChatInput).clear()
            self.note("Edit cancelled.")

    def _take_back_queued(self) -> None:
        if self._queued is not None:
            self.query_one(ChatInput).give_back(self._queued)
            self._queued = None

    async def action_quit(self) -> None:
        if self._reply is not None and self._stop is not None:
            # Keep what was generated: the worker's last batch may never be handled after exit.
            self._stop.set()
            s = self._reply.splitter
            self.session.add_assistant(s.answer.strip(), s.thinking.strip(), {"stop_reason": "quit"})
            self._reply = None
        self.exit(return_code=self.exit_code)

    def _show_context(self, used: int | None = None) -> None:
        """The context meter: tokens the conversation fills of the engine's context."""
        if self.engine is None:
            return
        if used is None:
            try:
                s = self.settings
                used = len(self.engine.tokenizer.render_chat(self.session.model_messages(s.system), add_generation_prompt=False,
                                                             thinking=s.thinking)) if self.session.messages else 0
            except Exception:  # noqa: BLE001 - the meter is informative only
                log.exception("counting the context failed")
                return
        left_out = self.session.window
        self._meter = f"context {used:,}/{self.max_context:,} tokens"
        if left_out:
            self._meter += f" · {left_out} older message{'s' if left_out != 1 else ''} left out"
        elif used > self.max_context:
            self._meter += " · the oldest turns are left out at the next message"
        self._render_status()

    def _render_status(self) -> None:
        hidden = "" if self.query_one(TreePanel).display else "ctrl+t: DDTree panel"
        self.query_one("#status-line", Static).update(" · ".join(part for part in (self._meter, hidden) if part))

    # -- retry, edit, copy -----------------------------------------------------------------

    def _busy(self) -> bool:
        """True (and a hint) when a reply cannot start now."""
        if self.engine is None:
            self.notify("The model is still loading.", severity="warning")
            return True
        if self.generating:
            self.notify("Stop the reply first (Esc).", severity="warning")
            return True
        return False

    def _last_user_index(self) -> int:
        return max(i for i, m in enumerate(self.session.messages) if m.role == "user")

    def retry(self) -> None:
        self.call_later(self._retry)

    async def _retry(self) -> None:
        if self._busy():
            return
        msgs = self.session.messages
        if self.session.last("user") is None:
            self.note("Nothing to retry yet: send a message first.", "error")
            return
        base = msgs[:-1] if msgs[-1].role == "assistant" else msgs
        fitted = self._fit(base)
        if fitted is None:
            return
        if msgs[-1].role == "assistant":
            self.session.take_last_reply()
            replies = list(self.query_one("#log").query(AssistantMessage))
            if replies:
                await replies[-1].remove()
        self.session.window = fitted[0]
        s = self.settings
        # NOTE: the same seed would sample the same reply again; at temperature 0 no seed changes it
        seed = random.randrange(2**31) if s.temperature > 0 else None
        if seed is None:
            self.note("At temperature 0 the same settings give the same reply (/temp above 0 varies it).")
        await self._generate(fitted[1], seed)

    def edit(self) -> None:
        if self.generating:
            self.notify("Stop the reply first (Esc).", severity="warning")
            return
        last = self.session.last("user")
        if last is None:
            self.note("Nothing to edit yet: send a message first.", "error")
            return
        self._editing = True
        self.prefill(last.content)
        self.note("Editing your last message: Enter sends it in place of the old turn; Esc cancels.")

    async def _remove_last_turn(self) -> None:
        log_widget = self.query_one("#log", VerticalScroll)
        users = list(log_widget.query(UserMessage))
        if not users:
            return
        children = list(log_widget.children)
        at = children.index(users[-1])
        await log_widget.remove_children([w for w in children[at:] if isinstance(w, (UserMessage, AssistantMessage))])

    def copy(self, what: str = "") -> None:
        last = self.session.last("assistant")
        if last is None or not last.content.strip():
            self.notify("There is no reply to copy yet.", severity="warning")
            return
        if what == "code":
            blocks = code_blocks(last.content)
            if not blocks:
                self.notify("The last reply has no code block (/copy copies the whole reply).", severity="warning")
                return
            text, name = blocks[-1], "code block"
        else:
            text, name = last.content, "reply"
        self.copy_to_clipboard(text)
        lines = text.count("\n") + 1
        self.notify(f"Copied the last {name} ({lines} line{'s' if lines != 1 else ''}) to the clipboard.", timeout=3)

    def action_copy_reply(self) -> None:
        self.copy()

    def action_copy_code(self) -> None:
        self.copy("code")

    def action_scroll_chat(self, direction: int) -> None:
        log_widget = self.query_one("#log", VerticalScroll)
        if direction < 0:
            log_widget.scroll_page_up(animate=False)
        else:
            log_widget.scroll_page_down(animate=False)

    # -- panes -----------------------------------------------------------------------------

    def action_toggle_debug(self) -> None:
        pane = self.query_one(DebugPane)
        pane.display = not pane.display
        if pane.display:
            pane.refresh_view()

    def action_debug_step(self, delta: int) -> None:
        pane = self.query_one(DebugPane)
        pane.display = True
        pane.action_step(delta)

    def action_toggle_tree(self) -> None:
        narrow = self.query_one("#main").has_class("narrow")
        self._tree_shown[narrow] = not self._tree_shown[narrow]
        self._layout(self.size.width)

    # -- settings and conversations ---------------------------------------------------------

    def set_setting(self, name: str, value) -> str:
        value = settings_mod.validate(name, value)
        if name == "mode" and value not in self.modes:
            raise SettingsError(f"Mode {value} needs a drafter; this model was loaded without one (use --draft DIR).")
        self.settings = self.settings.replace(**{name: value})
        self.session.save_settings(dataclasses.asdict(self.settings))
        self._settings_changed()
        shown = {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value
        if name == "system":
            return f"System prompt set: {value}" if value else "System prompt cleared."
        return f"{name} = {shown} (this conversation; /save keeps it as the default)"

    def _settings_changed(self) -> None:
        panel = self.query_one(TreePanel)
        if not self.generating:
            panel.mode, panel.budget = self.settings.mode, self.settings.budget
            panel.start_reply(self.settings.mode, self.settings.budget)
            self._show_context()

    def save_defaults(self) -> None:
        try:
            path = settings_mod.save(self.settings)
        except OSError as err:
            self.note(f"Could not save settings: {err.strerror or err}.", "error")
            return
        self.base_settings = self.settings
        self.note(f"Saved the current settings as defaults in {path}.")

    def action_new_chat(self) -> None:
        self.new_chat()

    def new_chat(self, note: str = "New conversation.") -> None:
        if self.generating:
            self.notify("Stop the reply first (Esc).", severity="warning")
            return
        self.session.new()
        self._editing = False
        self.settings = self.base_settings
        self.query_one("#log", VerticalScroll).remove_children()
        self.query_one(TreePanel).reset()
        self.query_one(DebugPane).reset(self.piece)
        self._settings_changed()
        self.note(note)

    def action_conversations(self) -> None:
        if self.session.history is None:
            self.note("Conversations are not being saved in this session.", "error")
            return
        if self.generating:
            self.notify("Stop the reply first (Esc).", severity="warning")
            return
        self.push_screen(ConversationsScreen(self.session.history, self.session.conversation_id), self._on_conversation_choice)

    async def _on_conversation_choice(self, choice) -> None:
        if not choice:
            return
        action, cid = choice
        if action == "new":
            self.new_chat()
            return
        stored = self.session.open(cid)
        self._editing = False
        self.settings = self._restored(stored)
        log_widget = self.query_one("#log", VerticalScroll)
        await log_widget.remove_children()
        self.query_one(TreePanel).reset()
        self.query_one(DebugPane).reset(self.piece)
        widgets = [Note(f"Conversation: {self.session.title}")]
        for m in self.session.messages:
            if m.role == "user":
                widgets.append(UserMessage(m.content))
            elif m.role == "assistant":
                widgets.append(AssistantMessage(False, m.content, m.thinking, footer_for(m.meta or {}, saved=True)))
        await log_widget.mount_all(widgets)
        log_widget.scroll_end(animate=False)
        self._settings_changed()

    def _restored(self, stored: dict) -> Settings:
        """The base settings with a saved conversation's own values on top (values no longer valid are skipped)."""
        values = {}
        for name, value in stored.items():
            if name not in settings_mod.FIELD_NAMES:
                continue
            try:
                values[name] = settings_mod.validate(name, value)
            except SettingsError:
                log.warning("stored setting %s=%r ignored", name, value)
        restored = self._usable(self.base_settings.replace(**values))
        if restored.mode != values.get("mode", restored.mode):
            self.note(f"This conversation used mode {values['mode']}, which this model cannot run; using {restored.mode}.")
        return restored

    def on_conversation_deleted(self, msg: ConversationDeleted) -> None:
        if self.session.conversation_id == msg.conversation_id:
            self.session.conversation_id = None  # NOTE: nothing more goes to the deleted conversation
            self.new_chat("The open conversation was deleted; this is a new chat.")

    def export_conversation(self, path: str | None) -> None:
        """Export what is on screen (an unsaved chat too), with this conversation's settings."""
        session = self.session
        if not session.messages:
            self.note("Nothing to export yet: send a message first.", "error")
            return
        try:
            saved = session.history.get(session.conversation_id) if session.history and session.conversation_id else None
            now = time.time()
            conv = Conversation(session.conversation_id or 0, session.title, saved.created if saved else now,
                                saved.updated if saved else now, len(session.messages), dataclasses.asdict(self.settings))
            if path:
                target = Path(path)
            else:
                folder = paths.data_dir() / "exports"
                folder.mkdir(exist_ok=True)  # NOTE: our own folder under the data dir, not one the user named
                target = export.default_path(folder, conv)
            out = export.write(conv, session.messages, target)
        except export.ExportError as err:
            self.note(str(err), "error")
            return
        except (OSError, sqlite3.Error) as err:
            self.note(f"Could not export: {getattr(err, 'strerror', None) or err}.", "error")
            return
        self.note(f"Exported the conversation to {out}.")


def run_app(args) -> int:
    from ddtree_chat.ui.startup import build_app

    app = build_app(args)
    app.run()
    return app.exit_code if app.return_code in (None, 0) else app.return_code
