"""The open conversation: its messages, and writing them to the history store.

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
        self.conversation_id: int | None = None
        self.title = "New chat"
        self.messages: list[Message] = []
        self._warned = False

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
        self.conversation_id = None
        self.title = "New chat"
        self.messages = []

    def open(self, conversation_id: int) -> None:
        assert self.history is not None
        conv = self.history.get(conversation_id)
        if conv is None:
            raise KeyError(conversation_id)
        self.conversation_id = conv.id
        self.title = conv.title
        self.messages = self.history.messages(conv.id)

    def add_user(self, text: str, settings: dict) -> None:
        if self.conversation_id is None:
            self.title = _title(text)
            self.conversation_id = self._store(self.history.new_conversation, self.title, settings) if self.history else None
        self.messages.append(Message("user", text))
        if self.conversation_id is not None:
            self._store(self.history.add_message, self.conversation_id, "user", text)

    def add_assistant(self, answer: str, thinking: str, meta: dict) -> None:
        self.messages.append(Message("assistant", answer, thinking, meta))
        if self.conversation_id is not None:
            self._store(self.history.add_message, self.conversation_id, "assistant", answer, thinking, meta)

    def rename(self, title: str) -> bool:
        """Rename the current conversation; False when nothing has been saved yet."""
        title = title.strip()[:120]
        if not title or self.conversation_id is None:
            return False
        self.title = title
        self._store(self.history.rename, self.conversation_id, title)
        return True

    def model_messages(self, system: str) -> list[dict]:
        """What the model sees: the system prompt and the answers (past thinking is dropped)."""
        out = [{"role": "system", "content": system}] if system.strip() else []
        out += [{"role": m.role, "content": m.content} for m in self.messages if m.role in ("user", "assistant")]
        return out


def _title(text: str) -> str:
    first = next((line.strip() for line in text.splitlines() if line.strip()), "New chat")
    return first if len(first) <= 60 else first[:59] + "…"
