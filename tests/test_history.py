import sqlite3

import pytest

from ddtree_chat.history import History


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


def test_export_markdown(home, tmp_path):
    h = History.open()
    cid = h.new_conversation("Greeting")
    h.add_message(cid, "user", "hi")
    h.add_message(cid, "assistant", "hello **you**", thinking="think\nmore")
    default = h.export_markdown(cid)
    assert default.parent == home / "data" / "exports"
    text = default.read_text()
    assert text.startswith("# Greeting") and "## You\n\nhi" in text and "hello **you**" in text and "> more" in text
    explicit = h.export_markdown(cid, tmp_path / "out" / "c.md")
    assert explicit.read_text() == text
