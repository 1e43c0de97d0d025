"""Conversation store: SQLite under the user data dir.

Every message is written in its own transaction when it completes (the user's when sent,
the assistant's when done or stopped), so a crash loses at most the reply in progress.
A corrupt database is moved aside (never overwritten) and a fresh one is started; a
locked one is left alone and this session writes to a fresh file beside it.

The schema version is kept in PRAGMA user_version and migrated forward at open, one step
at a time (see MIGRATIONS); a database from a newer version is left untouched.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from ddtree_chat import paths

DB_FILE = "history.sqlite3"

# NOTE: lists of single statements (executescript would commit the migration's transaction half-way)
_TABLES = [
    """CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    settings TEXT NOT NULL DEFAULT '{}'
)""",
    """CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
    content TEXT NOT NULL,
    thinking TEXT NOT NULL DEFAULT '',
    meta TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id)",
]

# Full-text index of the message text (external content: the text is stored once, in messages).
_FTS = [
    "CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(content, content='messages', content_rowid='id')",
    """CREATE TRIGGER IF NOT EXISTS messages_fts_insert AFTER INSERT ON messages BEGIN
        INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
    END""",
    """CREATE TRIGGER IF NOT EXISTS messages_fts_delete AFTER DELETE ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
    END""",
    """CREATE TRIGGER IF NOT EXISTS messages_fts_update AFTER UPDATE OF content ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
        INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
    END""",
    "INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')",
]


def _fts_available(conn: sqlite3.Connection) -> bool:
    try:
        conn.execute("CREATE VIRTUAL TABLE temp.fts_probe USING fts5(x)")
        conn.execute("DROP TABLE temp.fts_probe")
        return True
    except sqlite3.OperationalError:  # an SQLite built without FTS5: search falls back to LIKE
        return False


def _to_v1(conn: sqlite3.Connection) -> None:
    for statement in _TABLES:
        conn.execute(statement)


def _to_v2(conn: sqlite3.Connection) -> None:
    if _fts_available(conn):
        for statement in _FTS:
            conn.execute(statement)


MIGRATIONS = [_to_v1, _to_v2]  # MIGRATIONS[v] brings a version-v database to version v + 1
SCHEMA_VERSION = len(MIGRATIONS)


class NewerSchemaError(sqlite3.DatabaseError):
    """The database was written by a newer ddtree-chat; it is left as it is."""


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    created: float
    updated: float
    message_count: int
    settings: dict = field(default_factory=dict)
    match: str = ""  # a search hit's context, for the conversation list


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    thinking: str = ""
    meta: dict | None = None
    id: int | None = None


def _stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def _fts_query(text: str) -> str:
    """Every word of `text` as a quoted prefix term (so user text never parses as FTS syntax)."""
    return " ".join('"' + word.replace('"', '""') + '"*' for word in text.split())


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
        except NewerSchemaError:
            raise
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
            # NOTE: BEGIN IMMEDIATE + reading the version reads the file header, so corruption shows up
            # here (not later, mid-conversation) and a lock shows up as "database is locked".
            conn.execute("BEGIN IMMEDIATE")
            try:
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise NewerSchemaError(
                        f"the conversation database {path} is from a newer ddtree-chat (schema {version}); "
                        "it was left as it is")
                for migrate in MIGRATIONS[version:]:
                    migrate(conn)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
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

    def delete_messages(self, message_ids: list[int]) -> None:
        with self._tx() as c:
            c.executemany("DELETE FROM messages WHERE id = ?", [(i,) for i in message_ids])

    def set_settings(self, conversation_id: int, settings: dict) -> None:
        with self._tx() as c:
            c.execute("UPDATE conversations SET settings = ? WHERE id = ?", (json.dumps(settings), conversation_id))

    def rename(self, conversation_id: int, title: str) -> None:
        with self._tx() as c:
            c.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))

    def delete(self, conversation_id: int) -> None:
        with self._tx() as c:
            c.execute("DELETE FROM messages WHERE conversation_id = ?", (conversation_id,))
            c.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # -- reading ------------------------------------------------------------------------

    _LIST = ("SELECT c.id, c.title, c.created, c.updated, COUNT(m.id), c.settings FROM conversations c "
             "LEFT JOIN messages m ON m.conversation_id = c.id {where} GROUP BY c.id ORDER BY c.updated DESC, c.id DESC")

    def _list(self, where: str = "", args: tuple = ()) -> list[Conversation]:
        rows = self._conn.execute(self._LIST.format(where=where), args).fetchall()
        return [Conversation(*row[:5], json.loads(row[5] or "{}")) for row in rows]

    def conversations(self) -> list[Conversation]:
        return self._list()

    def get(self, conversation_id: int) -> Conversation | None:
        found = self._list("WHERE c.id = ?", (conversation_id,))
        return found[0] if found else None

    def messages(self, conversation_id: int) -> list[Message]:
        rows = self._conn.execute(
            "SELECT role, content, thinking, meta, id FROM messages WHERE conversation_id = ? ORDER BY id",
            (conversation_id,),
        ).fetchall()
        return [Message(role, content, thinking, json.loads(meta or "{}"), mid) for role, content, thinking, meta, mid in rows]

    def has_fts(self) -> bool:
        return self._conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'messages_fts'").fetchone() is not None

    def search(self, text: str) -> list[Conversation]:
        """Conversations whose title or messages contain every word of `text` (word prefixes), newest first."""
        if not text.split():
            return self.conversations()
        words = text.split()
        title_hit = " AND ".join("c.title LIKE ?" for _ in words)
        like = tuple(f"%{w}%" for w in words)
        snippets: dict[int, str] = {}
        if self.has_fts():
            rows = self._conn.execute(
                "SELECT m.conversation_id, snippet(messages_fts, 0, '', '', '…', 8) FROM messages_fts "
                "JOIN messages m ON m.id = messages_fts.rowid WHERE messages_fts MATCH ? ORDER BY rank",
                (_fts_query(text),)).fetchall()
        else:
            rows = self._conn.execute(
                "SELECT conversation_id, substr(content, 1, 60) FROM messages WHERE "
                + " AND ".join("content LIKE ?" for _ in words), like).fetchall()
        for cid, snippet in rows:
            snippets.setdefault(cid, " ".join(snippet.split()))
        ids = tuple(snippets)
        where = f"WHERE ({title_hit})" + (f" OR c.id IN ({','.join('?' * len(ids))})" if ids else "")
        found = self._list(where, like + ids)
        return [Conversation(c.id, c.title, c.created, c.updated, c.message_count, c.settings, snippets.get(c.id, ""))
                for c in found]


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
