"""Modal list of saved conversations: open, delete, or start a new one."""

from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Footer, Label, OptionList
from textual.widgets.option_list import Option

from ddtree_chat.history import History


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


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
    ]

    def __init__(self, history: History, current: int | None):
        super().__init__()
        self.history = history
        self.current = current
        self._armed: int | None = None  # NOTE: delete takes two presses on the same conversation

    def compose(self) -> ComposeResult:
        with Vertical(id="conversations-box"):
            yield Label("Conversations — enter open · d d delete · n new · esc close", id="conversations-title")
            yield OptionList(id="conversations-list")
        yield Footer()

    def on_mount(self) -> None:
        self._fill()

    def _fill(self) -> None:
        options = self.query_one(OptionList)
        options.clear_options()
        convs = self.history.conversations()
        for c in convs:
            mark = "▶ " if c.id == self.current else "  "
            options.add_option(Option(f"{mark}{c.title}  ·  {c.message_count} messages  ·  {_when(c.updated)}", id=str(c.id)))
        if not convs:
            options.add_option(Option("no saved conversations yet", id="none", disabled=True))
        else:
            current = next((i for i, c in enumerate(convs) if c.id == self.current), 0)
            options.highlighted = current
        options.focus()

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
