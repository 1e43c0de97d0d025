"""Exports: Markdown keeps code blocks whole, JSON carries messages, settings and per-reply stats."""

from __future__ import annotations

import json

import pytest

from ddtree_chat.history import Conversation, Message
from ddtree_chat.ui import export
from ddtree_chat.ui.copying import code_blocks

CONV = Conversation(7, "Lists", 1.0, 2.0, 4, {"system": "Be brief.", "mode": "ddtree", "budget": "auto", "seed": 3,
                                              "repeat_penalty": 1.1})
MESSAGES = [
    Message("user", "reverse a list"),
    Message("assistant", "```python\ndef rev(xs):\n    return xs[::-1]\n```", meta={"rounds": 4, "tokens": 12}),
    Message("user", "and in place?"),
    Message("assistant", "Like this:\n```python\nxs.reverse()\n```\nor\n```python\nxs[:] = xs[", meta={"stop_reason": "stopped"}),
]


def test_markdown_keeps_code_blocks_and_settings():
    text = export.to_markdown(CONV, MESSAGES)
    assert text.startswith("# Lists\n") and "seed 3" in text and "## System\n\nBe brief." in text
    assert "repeat_penalty 1.1" in text
    assert "```python\ndef rev(xs):\n    return xs[::-1]\n```" in text
    assert code_blocks(text) == ["def rev(xs):\n    return xs[::-1]", "xs.reverse()", "xs[:] = xs["]
    assert text.rstrip().endswith("*(stopped)*"), "the open fence was closed, so the note is Markdown again"


def test_json_has_messages_settings_and_stats():
    data = json.loads(export.to_json(CONV, MESSAGES))
    assert data["title"] == "Lists" and data["settings"]["system"] == "Be brief." and data["settings"]["seed"] == 3
    assert data["settings"]["repeat_penalty"] == 1.1
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"] * 2
    assert data["messages"][1]["stats"] == {"rounds": 4, "tokens": 12} and "stats" not in data["messages"][0]


def test_write_refuses_existing_files_folders_and_missing_dirs(tmp_path):
    (tmp_path / "taken.md").write_text("mine")
    for path, why in ((tmp_path / "taken.md", "already exists"), (tmp_path, "is a folder"),
                      (tmp_path / "missing" / "x.md", "does not exist")):
        with pytest.raises(export.ExportError, match=why):
            export.write(CONV, MESSAGES, path)
    assert (tmp_path / "taken.md").read_text() == "mine" and not (tmp_path / "missing").exists()
    out = export.write(CONV, MESSAGES, tmp_path / "chat.JSON")
    assert json.loads(out.read_text())["id"] == 7
