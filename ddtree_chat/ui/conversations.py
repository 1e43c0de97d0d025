"""Modal list of saved conversations: search, open, delete, or start a new one."""

from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Footer, Input, Label, OptionList
from textual.widgets.option_list import Option

from ddtree_chat.history import Conversation, History


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def describe(c: Conversation, current: int | None) -> str:
    mark = "▶ " if c.id == current else "  "
    line = f"{mark}{c.title}  ·  {plural(c.message_count, 'message')}  ·  {_when(c.updated)}  ·  #{c.id}"
    return line + (f"\n    …{c.match}…" if c.match else "")


class ConversationDeleted(Message):
    def __init__(self, conversation_id: int):
        super().__init__()
        self.conversation_id = conversation_id


class ConversationsScreen(ModalScreen):
    """Dismisses with ("open", id), ("new", None) or None."""

    BINDINGS = [
        Binding("escape", "dismiss(None)", "Close"),
        Binding("n", "new", "New chat"),
        Binding("d,delete", "delete", "Delete"),
        Binding("slash,ctrl+f", "search", "Search"),
    ]

    def __init__(self, history: History, current: int | None):
        super().__init__()
        self.history = history
        self.current = current
        self._armed: int | None = None  # NOTE: delete takes two presses on the same conversation

    def compose(self) -> ComposeResult:
        with Vertical(id="conversations-box"):
            yield Label("Conversations — enter open · d d delete · n new · / search · esc close", id="conversations-title")
            yield Input(placeholder="search the conversations (words in titles and messages)", id="conversations-search")
            yield OptionList(id="conversations-list")
        yield Footer()

    def on_mount(self) -> None:
        self._fill()
        self.query_one(OptionList).focus()

    @property
    def query_text(self) -> str:
        return self.query_one("#conversations-search", Input).value

    def _fill(self) -> None:
        options = self.query_one(OptionList)
        options.clear_options()
        text = self.query_text
        convs = self.history.search(text) if text.strip() else self.history.conversations()
        for c in convs:
            options.add_option(Option(describe(c, self.current), id=str(c.id)))
        if not convs:
            empty = f"nothing matches “{text.strip()}”" if text.strip() else "no saved conversations yet"
            options.add_option(Option(empty, id="none", disabled=True))
        else:
            options.highlighted = next((i for i, c in enumerate(convs) if c.id == self.current), 0)

    def on_input_changed(self, event: Input.Changed) -> None:
        self._fill()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.query_one(OptionList).focus()  # NOTE: enter in the search box goes to the results

    def action_search(self) -> None:
        self.query_one("#conversations-search", Input).focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        if event.option.id and event.option.id != "none":
            self.dismiss(("open", int(event.option.id)))

    def action_new(self) -> None:
        self.dismiss(("new", None))

    def action_delete(self) -> None:
        options = self.query_one(OptionList)
        if options.highlighted is None:
            return
        option = options.get_option_at_index(options.highlighted)
        if not option.id or option.id == "none":
            return
        cid = int(option.id)
        conv = self.history.get(cid)
        if self._armed != cid:
            self._armed = cid
            self.app.notify(f"Press d again to delete “{conv.title if conv else cid}”.", timeout=4)
            return
        self._armed = None
        self.history.delete(cid)
        self.app.notify(f"Deleted “{conv.title if conv else cid}”.", timeout=3)
        if cid == self.current:
            self.current = None
            self.app.post_message(ConversationDeleted(cid))
        self._fill()
