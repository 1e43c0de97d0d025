"""Conversation store: SQLite under the user data dir.

Every message is written in its own transaction when it completes (the user's when sent,
the assistant's when done or stopped), so a crash loses at most the reply in progress.
A corrupt database is moved aside (never overwritten) and a fresh one is started; a
locked one is left alone and this session writes to a fresh file beside it.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from ddtree_chat import paths

DB_FILE = "history.sqlite3"
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    settings TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
    content TEXT NOT NULL,
    thinking TEXT NOT NULL DEFAULT '',
    meta TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
"""


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    created: float
    updated: float
    message_count: int


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    thinking: str = ""
    meta: dict | None = None


def _stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


class History:
    """Open with History.open(); `warning` is a user-facing sentence when recovery happened."""

    def __init__(self, conn: sqlite3.Connection, path: Path, warning: str | None = None):
        self._conn = conn
        self.path = path
        self.warning = warning

    # -- opening and recovery ------------------------------------------------------

    @classmethod
    def open(cls, path: Path | None = None, timeout: float = 2.0) -> "History":
        path = Path(path) if path else paths.data_dir() / DB_FILE
        try:
            return cls(cls._connect(path, timeout), path)
        except sqlite3.OperationalError as err:
            if "locked" not in str(err).lower() and "busy" not in str(err).lower():
                raise
            fresh = path.with_name(f"{path.stem}-{_stamp()}{path.suffix}")
            warning = (
                f"The conversation database {path} is locked by another program; "
                f"this session saves to {fresh} instead (close the other ddtree-chat to use the main one)."
            )
            return cls(cls._connect(fresh, timeout), fresh, warning)
        except sqlite3.DatabaseError:
            aside = path.with_name(f"{path.stem}.corrupt-{_stamp()}{path.suffix}")
            n = 1
            while aside.exists():
                aside = path.with_name(f"{path.stem}.corrupt-{_stamp()}-{n}{path.suffix}")
                n += 1
            path.rename(aside)
            warning = (
                f"The conversation database was unreadable; it was moved to {aside} "
                f"and a new one was started at {path}."
            )
            return cls(cls._connect(path, timeout), path, warning)

    @staticmethod
    def _connect(path: Path, timeout: float) -> sqlite3.Connection:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(path), timeout=timeout, isolation_level=None)
        try:
            conn.execute("PRAGMA foreign_keys = ON")
            # NOTE: touching the schema reads the file header, so corruption shows up here
            # (not later, mid-conversation) and a lock shows up as "database is locked".
            conn.executescript(f"BEGIN IMMEDIATE;{_SCHEMA}PRAGMA user_version = {SCHEMA_VERSION};COMMIT;")
            if conn.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise sqlite3.DatabaseError("quick_check failed")
        except BaseException:
            conn.close()
            raise
        return conn

    def close(self) -> None:
        self._conn.close()

    # -- writing ------------------------------------------------------------------------

    def _tx(self):
        return _Transaction(self._conn)

    def new_conversation(self, title: str, settings: dict | None = None) -> int:
        now = time.time()
        with self._tx() as c:
            cur = c.execute(
                "INSERT INTO conversations (title, created, updated, settings) VALUES (?, ?, ?, ?)",
                (title or "New chat", now, now, json.dumps(settings or {})),
            )
            return int(cur.lastrowid)

    def add_message(self, conversation_id: int, role: str, content: str, thinking: str = "", meta: dict | None = None) -> int:
        now = time.time()
        with self._tx() as c:
            cur = c.execute(
                "INSERT INTO messages (conversation_id, role, content, thinking, meta, created) VALUES (?, ?, ?, ?, ?, ?)",
                (conversation_id, role, content, thinking, json.dumps(meta or {}), now),
            )
            c.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))
            return int(cur.lastrowid)

    def rename(self, conversation_id: int, title: str) -> None:
        with self._tx() as c:
            c.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))

    def delete(self, conversation_id: int) -> None:
        with self._tx() as c:
            c.execute("DELETE FROM messages WHERE conversation_id = ?", (conversation_id,))
            c.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # -- reading ------------------------------------------------------------------------

    def conversations(self) -> list[Conversation]:
        rows = self._conn.execute(
            "SELECT c.id, c.title, c.created, c.updated, COUNT(m.id) FROM conversations c "
            "LEFT JOIN messages m ON m.conversation_id = c.id GROUP BY c.id ORDER BY c.updated DESC, c.id DESC"
        ).fetchall()
        return [Conversation(*row) for row in rows]

    def get(self, conversation_id: int) -> Conversation | None:
        return next((c for c in self.conversations() if c.id == conversation_id), None)

    def messages(self, conversation_id: int) -> list[Message]:
        rows = self._conn.execute(
            "SELECT role, content, thinking, meta FROM messages WHERE conversation_id = ? ORDER BY id",
            (conversation_id,),
        ).fetchall()
        return [Message(role, content, thinking, json.loads(meta or "{}")) for role, content, thinking, meta in rows]

    # -- export ------------------------------------------------------------------------

    def export_markdown(self, conversation_id: int, path: Path | None = None) -> Path:
        conv = self.get(conversation_id)
        if conv is None:
            raise KeyError(conversation_id)
        if path is None:
            folder = paths.data_dir() / "exports"
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"conversation-{conv.id}-{_stamp()}.md"
        path = Path(path).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(to_markdown(conv.title, self.messages(conversation_id)), encoding="utf-8")
        return path


def to_markdown(title: str, messages: list[Message]) -> str:
    out = [f"# {title}", ""]
    names = {"system": "System", "user": "You", "assistant": "Assistant"}
    for m in messages:
        out += [f"## {names.get(m.role, m.role)}", ""]
        if m.thinking.strip():
            quoted = "\n".join("> " + line for line in m.thinking.strip().splitlines())
            out += ["<details><summary>Thinking</summary>", "", quoted, "", "</details>", ""]
        out += [m.content.rstrip(), ""]
        if (m.meta or {}).get("stop_reason") == "stopped":
            out += ["*(stopped)*", ""]
    return "\n".join(out)


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, ROLLBACK on error (the connection is in autocommit mode)."""

    def __init__(self, conn: sqlite3.Connection):
        self._conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self._conn.execute("BEGIN IMMEDIATE")
        return self._conn

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._conn.execute("ROLLBACK" if exc_type else "COMMIT")
        return False
