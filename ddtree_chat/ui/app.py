"""The Textual chat app: wiring of the conversation, the tree panel, the debug pane and the engine.

Entry point for the CLI's interactive mode: `run_app(args) -> int`.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path
from typing import Callable

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Footer, Header, Label, ProgressBar

from ddtree_chat import settings as settings_mod
from ddtree_chat.history import History
from ddtree_chat.settings import Settings, SettingsError
from ddtree_chat.ui import commands
from ddtree_chat.ui.chat_view import AssistantMessage, ChatInput, Note, UserMessage
from ddtree_chat.ui.conversations import ConversationDeleted, ConversationsScreen
from ddtree_chat.ui.debug_pane import DebugPane
from ddtree_chat.ui.generation import UPDATE_INTERVAL, GenerationDone, GenerationFailed, GenerationUpdate, run_generation
from ddtree_chat.ui.loading import (EngineFailed, EngineProgress, EngineReady, ErrorScreen, describe_error, loading_label,
                                    setup_logging, start_loading)
from ddtree_chat.ui.replies import footer_for, meta_for
from ddtree_chat.ui.tree_panel import TreePanel

log = logging.getLogger("ddtree_chat.ui")


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
        Binding("ctrl+t", "toggle_tree", "Tree panel", show=False),
    ]

    def __init__(self, engine_factory: Callable, settings: Settings | None = None, *, warnings: list[str] | None = None,
                 history: History | None = None, open_history: bool = True, config_cls=None, model_label: str = ""):
        super().__init__()
        setup_logging()
        self.engine_factory = engine_factory
        self.settings = settings or Settings()
        self.engine = None
        self.config_cls = config_cls
        self.model_label = model_label
        self._startup_warnings = list(warnings or [])
        if history is None and open_history:
            try:
                history = History.open()
            except (sqlite3.Error, OSError) as err:
                log.exception("opening the conversation database failed")
                self._startup_warnings.append(f"Conversations cannot be saved: {err}.")
        if history is not None and history.warning:
            self._startup_warnings.append(history.warning)
        from ddtree_chat.ui.session import ChatSession

        self.session = ChatSession(history, lambda text: self.note(text, "error"))
        self._gen_id = 0
        self._stop: threading.Event | None = None
        self._reply: AssistantMessage | None = None
        self.exit_code = 0
        self.update_interval = UPDATE_INTERVAL

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
        self.query_one(ChatInput).focus()
        start_loading(self.engine_factory, self.post_message)

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
        if self.settings.mode is None or self.settings.mode not in self.modes:
            self.settings = self.settings.replace(mode="ddtree" if "ddtree" in self.modes else "ar")
        self.sub_title = f"{info.get('model', self.model_label)} · {info.get('device', '?')}"
        panel = self.query_one(TreePanel)
        panel.configure(info, self.piece, self.settings.mode, self.settings.budget)
        drafter = "with drafter" if info.get("has_drafter") else "no drafter (ar only)"
        self.note(f"Loaded {info.get('model', 'model')} on {info.get('device', '?')}, {drafter}. Type /help for commands.")

    def on_engine_failed(self, msg: EngineFailed) -> None:
        self.exit_code = 1
        self.push_screen(ErrorScreen("Could not load the model", msg.message))

    @property
    def modes(self) -> list[str]:
        if self.engine is None:
            return list(settings_mod.MODES)
        info = getattr(self.engine, "info", {}) or {}
        return list(info.get("modes") or (settings_mod.MODES if info.get("has_drafter") else ["ar"]))

    def piece(self, token_id: int) -> str:
        try:
            return self.engine.tokenizer.piece(int(token_id))
        except Exception:  # noqa: BLE001 - a display helper must never break the UI
            return f"<{token_id}>"

    # -- chat ------------------------------------------------------------------------------

    def note(self, text: str, kind: str = "info") -> None:
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
            box.text = ""
            commands.run_command(self, msg.text)
            return
        if self.engine is None:
            self.notify("The model is still loading; your message is kept in the input.", severity="warning")
            return
        if self.generating:
            self.notify("A reply is still being written; press Esc to stop it.", severity="warning")
            return
        box.text = ""
        await self.send(msg.text.strip("\n"))

    async def send(self, text: str) -> None:
        s = self.settings
        log_widget = self.query_one("#log", VerticalScroll)
        await log_widget.mount(UserMessage(text))
        self.session.add_user(text, {"mode": s.mode, "budget": s.budget})
        try:
            prompt = self.engine.tokenizer.render_chat(self.session.model_messages(s.system), add_generation_prompt=True, thinking=s.thinking)
            config = self._config_cls()(mode=s.mode, budget=s.budget, temperature=s.temperature, top_p=s.top_p, seed=s.seed,
                                        max_new_tokens=s.max_new_tokens)
        except Exception as err:  # noqa: BLE001
            log.exception("preparing the prompt failed")
            self.note(describe_error(err), "error")
            return
        self._reply = AssistantMessage(in_think=s.thinking)
        await log_widget.mount(self._reply)
        log_widget.anchor()
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
        self.query_one(TreePanel).add_rounds(msg.rounds)
        self.query_one(DebugPane).add_rounds(msg.rounds)
        await self._reply.append(msg.text)

    async def on_generation_done(self, msg: GenerationDone) -> None:
        if msg.gen_id != self._gen_id or self._reply is None:
            return
        self.query_one(TreePanel).finish(msg.done)
        meta = meta_for(msg.done, self.settings)
        await self._finish_reply(msg.done.get("text"), footer_for(meta), meta)

    async def on_generation_failed(self, msg: GenerationFailed) -> None:
        if msg.gen_id != self._gen_id or self._reply is None:
            return
        text = describe_error(msg.error).replace("while loading the model", "while generating")
        await self._finish_reply(msg.text, "error", {"stop_reason": "error", "error": text})
        self.note(text, "error")

    async def _finish_reply(self, full_text: str | None, footer: str, meta: dict) -> None:
        reply, self._reply, self._stop = self._reply, None, None
        thinking, answer = await reply.finish(footer, full_text)
        self.session.add_assistant(answer, thinking, meta)

    def action_stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    async def action_quit(self) -> None:
        if self._reply is not None and self._stop is not None:
            # Keep what was generated: the worker's last batch may never be handled after exit.
            self._stop.set()
            s = self._reply.splitter
            self.session.add_assistant(s.answer.strip(), s.thinking.strip(), {"stop_reason": "quit"})
            self._reply = None
        self.exit(return_code=self.exit_code)

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
        panel = self.query_one(TreePanel)
        panel.display = not panel.display

    # -- settings and conversations ---------------------------------------------------------

    def set_setting(self, name: str, value) -> str:
        value = settings_mod.validate(name, value)
        if name == "mode" and value not in self.modes:
            raise SettingsError(f"Mode {value} needs a drafter; this model was loaded without one (use --draft DIR).")
        self.settings = self.settings.replace(**{name: value})
        panel = self.query_one(TreePanel)
        if name in ("mode", "budget") and not self.generating:
            panel.mode, panel.budget = self.settings.mode, self.settings.budget
            panel.start_reply(self.settings.mode, self.settings.budget)
        shown = {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value
        if name == "system":
            return f"System prompt set: {value}" if value else "System prompt cleared."
        return f"{name} = {shown} (this session; /save keeps it as the default)"

    def save_defaults(self) -> None:
        try:
            path = settings_mod.save(self.settings)
        except OSError as err:
            self.note(f"Could not save settings: {err}.", "error")
            return
        self.note(f"Saved the current settings as defaults in {path}.")

    def action_new_chat(self) -> None:
        self.new_chat()

    def new_chat(self) -> None:
        if self.generating:
            self.notify("Stop the reply first (Esc).", severity="warning")
            return
        self.session.new()
        self.query_one("#log", VerticalScroll).remove_children()
        self.note("New conversation.")

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
        self.session.open(cid)
        log_widget = self.query_one("#log", VerticalScroll)
        await log_widget.remove_children()
        widgets = [Note(f"Conversation: {self.session.title}")]
        for m in self.session.messages:
            if m.role == "user":
                widgets.append(UserMessage(m.content))
            elif m.role == "assistant":
                widgets.append(AssistantMessage(False, m.content, m.thinking, footer_for(m.meta or {}, saved=True)))
        await log_widget.mount_all(widgets)
        log_widget.scroll_end(animate=False)

    def on_conversation_deleted(self, msg: ConversationDeleted) -> None:
        if self.session.conversation_id == msg.conversation_id:
            self.session.conversation_id = None  # keep the text on screen; it is no longer saved

    def export_conversation(self, path: str | None) -> None:
        if self.session.history is None or self.session.conversation_id is None:
            self.note("Nothing to export yet: send a message first.", "error")
            return
        try:
            out = self.session.history.export_markdown(self.session.conversation_id, Path(path) if path else None)
        except (OSError, sqlite3.Error) as err:
            self.note(f"Could not export: {err}.", "error")
            return
        self.note(f"Exported the conversation to {out}.")


def run_app(args) -> int:
    from ddtree_chat.ui.startup import build_app

    app = build_app(args)
    app.run()
    return app.exit_code if app.return_code in (None, 0) else app.return_code
