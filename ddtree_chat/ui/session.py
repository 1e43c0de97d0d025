"""The open conversation: its messages, settings and context window, and writing them to the history store.

A store that fails mid-session (disk full, locked by another program) must not take the
chat down with it: the conversation goes on in memory and the user is told once.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Callable

from ddtree_chat.history import History, Message

log = logging.getLogger("ddtree_chat.ui")


class ChatSession:
    def __init__(self, history: History | None, warn: Callable[[str], None]):
        self.history = history
        self.warn = warn
        self._warned = False
        self.new()

    def _store(self, fn, *args):
        if self.history is None:
            return None
        try:
            return fn(*args)
        except sqlite3.Error as err:
            log.exception("history write failed")
            if not self._warned:
                self._warned = True
                self.warn(f"Could not save to the conversation database ({err}); this chat continues unsaved.")
            return None

    def new(self) -> None:
        self.conversation_id: int | None = None
        self.title = "New chat"
        self.messages: list[Message] = []
        self.window = 0  # index of the first message the model still sees (older turns were dropped)
        self.trim_noted = False  # the user has been told that old turns are left out

    def open(self, conversation_id: int) -> dict:
        """Load a saved conversation; returns its stored settings."""
        assert self.history is not None
        conv = self.history.get(conversation_id)
        if conv is None:
            raise KeyError(conversation_id)
        self.new()
        self.conversation_id = conv.id
        self.title = conv.title
        self.messages = self.history.messages(conv.id)
        return conv.settings

    def add_user(self, text: str, settings: dict) -> None:
        if self.conversation_id is None:
            self.title = _title(text)
            self.conversation_id = self._store(self.history.new_conversation, self.title, settings) if self.history else None
        mid = self._store(self.history.add_message, self.conversation_id, "user", text) if self.conversation_id else None
        self.messages.append(Message("user", text, id=mid))

    def add_assistant(self, answer: str, thinking: str, meta: dict) -> None:
        mid = None
        if self.conversation_id is not None:
            mid = self._store(self.history.add_message, self.conversation_id, "assistant", answer, thinking, meta)
        self.messages.append(Message("assistant", answer, thinking, meta, mid))

    def save_settings(self, settings: dict) -> None:
        if self.conversation_id is not None:
            self._store(self.history.set_settings, self.conversation_id, settings)

    def last(self, role: str) -> Message | None:
        return next((m for m in reversed(self.messages) if m.role == role), None)

    def take_last_reply(self) -> Message | None:
        """For /retry: remove the last reply, here and in the store (the regenerated one takes its place)."""
        if not self.messages or self.messages[-1].role != "assistant":
            return None
        old = self.messages.pop()
        if old.id is not None:
            self._store(self.history.delete_messages, [old.id])
        return old

    def drop_last_turn(self) -> Message | None:
        """For /edit: remove the last user message and what follows it, here and in the store."""
        at = next((i for i in range(len(self.messages) - 1, -1, -1) if self.messages[i].role == "user"), None)
        if at is None:
            return None
        dropped, self.messages = self.messages[at:], self.messages[:at]
        self.window = min(self.window, at)
        ids = [m.id for m in dropped if m.id is not None]
        if ids:
            self._store(self.history.delete_messages, ids)
        return dropped[0]

    def rename(self, title: str) -> bool:
        """Rename the current conversation; False when nothing has been saved yet."""
        title = title.strip()[:120]
        if not title or self.conversation_id is None:
            return False
        self.title = title
        self._store(self.history.rename, self.conversation_id, title)
        return True

    def model_messages(self, system: str, start: int | None = None, messages: list[Message] | None = None) -> list[dict]:
        """What the model sees: the system prompt and the messages from `start` (default: the window) on,
        of `messages` (default: this conversation's); past thinking is dropped."""
        out = [{"role": "system", "content": system}] if system.strip() else []
        kept = (self.messages if messages is None else messages)[self.window if start is None else start:]
        out += [{"role": m.role, "content": m.content} for m in kept if m.role in ("user", "assistant")]
        return out


def _title(text: str) -> str:
    first = next((line.strip() for line in text.splitlines() if line.strip()), "New chat")
    return first if len(first) <= 60 else first[:59] + "…"
