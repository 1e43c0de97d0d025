import sqlite3

import pytest

from ddtree_chat.history import SCHEMA_VERSION, History, NewerSchemaError


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DDTREE_CHAT_HOME", str(tmp_path))
    return tmp_path


def test_messages_persist_across_reopen():
    h = History.open()
    cid = h.new_conversation("hello there")
    h.add_message(cid, "user", "hi")
    h.add_message(cid, "assistant", "hello", thinking="hmm", meta={"stop_reason": "stopped"})
    h.close()
    h = History.open()
    assert [c.title for c in h.conversations()] == ["hello there"]
    msgs = h.messages(cid)
    assert [(m.role, m.content, m.thinking) for m in msgs] == [("user", "hi", ""), ("assistant", "hello", "hmm")]
    assert msgs[1].meta == {"stop_reason": "stopped"}
    assert h.warning is None


def test_delete_and_order():
    h = History.open()
    a = h.new_conversation("a")
    b = h.new_conversation("b")
    h.add_message(a, "user", "x")  # a becomes the most recent
    assert [c.id for c in h.conversations()] == [a, b]
    h.delete(a)
    assert [c.id for c in h.conversations()] == [b]
    assert h.messages(a) == []


def test_corrupt_database_is_moved_aside(home):
    db = home / "data" / "history.sqlite3"
    db.parent.mkdir(parents=True)
    db.write_bytes(b"this is not sqlite at all" * 100)
    h = History.open()
    assert h.warning and "moved to" in h.warning
    aside = [p for p in db.parent.iterdir() if "corrupt" in p.name]
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"this is not sqlite")
    h.add_message(h.new_conversation("t"), "user", "ok")
    assert len(h.conversations()) == 1


def test_locked_database_uses_fresh_file_beside_it(home):
    first = History.open()
    first.new_conversation("keep")
    blocker = sqlite3.connect(str(first.path), isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        second = History.open(timeout=0.1)
        assert second.path != first.path and second.path.parent == first.path.parent
        assert "locked" in second.warning
        second.new_conversation("other")
    finally:
        blocker.execute("ROLLBACK")
    assert [c.title for c in first.conversations()] == ["keep"]


# The schema as the first release wrote it (PRAGMA user_version 1): such a database must open and migrate.
V1_SCHEMA = """
CREATE TABLE conversations (id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL, created REAL NOT NULL,
    updated REAL NOT NULL, settings TEXT NOT NULL DEFAULT '{}');
CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')), content TEXT NOT NULL,
    thinking TEXT NOT NULL DEFAULT '', meta TEXT NOT NULL DEFAULT '{}', created REAL NOT NULL);
CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
PRAGMA user_version = 1;
"""


def _v1_database(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(path))
    conn.executescript(V1_SCHEMA)
    conn.execute("INSERT INTO conversations (title, created, updated, settings) VALUES ('old chat', 1, 2, '{\"mode\": \"ar\", \"budget\": 8}')")
    conn.execute("INSERT INTO messages (conversation_id, role, content, created) VALUES (1, 'user', 'how do I reverse a list', 1)")
    conn.execute("INSERT INTO messages (conversation_id, role, content, created) VALUES (1, 'assistant', 'use reversed()', 2)")
    conn.commit()
    conn.close()


def test_old_database_is_migrated_and_searchable(home):
    db = home / "data" / "history.sqlite3"
    _v1_database(db)
    h = History.open()
    assert h.warning is None and h.path == db
    assert sqlite3.connect(str(db)).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    (conv,) = h.conversations()
    assert conv.title == "old chat" and conv.message_count == 2 and conv.settings == {"mode": "ar", "budget": 8}
    assert [m.content for m in h.messages(conv.id)] == ["how do I reverse a list", "use reversed()"]
    # The messages written before the migration are in the index, and so are new ones.
    assert h.has_fts() and [c.id for c in h.search("revers")] == [conv.id]
    other = h.new_conversation("another")
    h.add_message(other, "user", "sorting dictionaries by value")
    assert [c.id for c in h.search("dictionaries")] == [other]
    assert "dictionaries" in h.search("dictionaries")[0].match
    h.close()
    assert History.open().conversations()[0].id == other  # a second open finds nothing left to migrate


def test_search_titles_words_and_odd_text():
    h = History.open()
    a = h.new_conversation("Pandas questions")
    h.add_message(a, "user", "merge two frames on a key")
    b = h.new_conversation("misc")
    h.add_message(b, "user", "write a haiku about frames")
    assert {c.id for c in h.search("frames")} == {a, b}
    assert [c.id for c in h.search("frames merge")] == [a]  # every word must match
    assert [c.id for c in h.search("pandas")] == [a]  # the title counts
    assert h.search('"unbalanced AND (quote') == []  # user text is never FTS syntax
    assert len(h.search("  ")) == 2


def test_deleted_and_retried_messages_leave_the_index():
    h = History.open()
    cid = h.new_conversation("t")
    keep = h.add_message(cid, "user", "alpha")
    gone = h.add_message(cid, "assistant", "bravo")
    h.delete_messages([gone])
    assert [m.id for m in h.messages(cid)] == [keep]
    assert h.search("bravo") == [] and [c.id for c in h.search("alpha")] == [cid]
    h.set_settings(cid, {"system": "be brief", "seed": 3})
    assert h.get(cid).settings == {"system": "be brief", "seed": 3}


def test_newer_database_is_left_alone(home):
    db = home / "data" / "history.sqlite3"
    db.parent.mkdir(parents=True)
    conn = sqlite3.connect(str(db))
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(NewerSchemaError, match="newer ddtree-chat"):
        History.open()
    assert db.exists() and not [p for p in db.parent.iterdir() if "corrupt" in p.name]
