"""The saved conversations from the command line, without loading a model: `--list`, `--search TEXT` (a table, or
one JSON object a line with --json) and `--export ID` (Markdown on stdout, JSON with --json), as the chat's
conversation list (ctrl+o) and /export show them."""

from __future__ import annotations

import json
import sqlite3
import sys
import time

from . import paths
from .history import DB_FILE, Conversation, History


class ArchiveError(Exception):
    """str(err) is the one line shown to the user."""


def _open() -> History | None:
    """The conversation store, or None when nothing was saved yet (no database file is made for a look)."""
    if not (paths.data_dir() / DB_FILE).is_file():
        return None
    try:
        history = History.open()
    except (OSError, sqlite3.Error) as err:
        raise ArchiveError(f"cannot open the saved conversations: {err}") from None
    if history.warning:
        print(f"ddtree-chat: {history.warning}", file=sys.stderr)
    return history


def _row(c: Conversation) -> dict:
    out = {"id": c.id, "title": c.title, "created": c.created, "updated": c.updated, "messages": c.message_count}
    return dict(out, match=c.match) if c.match else out


def _table(found: list[Conversation]) -> str:
    width = max(len("id"), *(len(str(c.id)) for c in found))
    lines = [f"{'id':>{width}}  updated           messages  title"]
    for c in found:
        stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(c.updated))
        lines.append(f"{c.id:>{width}}  {stamp}  {c.message_count:>8}  {c.title}")
        if c.match:
            lines.append(f"{'':>{width}}  … {c.match}")
    return "\n".join(lines)


def list_conversations(search: str | None, as_json: bool) -> int:
    """Print the saved conversations, newest first (those matching every word of `search`, when given); exit
    status 1 when a search finds none, as grep's."""
    history = _open()
    try:
        if history is None:
            found = []
        else:
            found = history.conversations() if search is None else history.search(search)
    finally:
        if history is not None:
            history.close()
    if as_json:
        for c in found:
            print(json.dumps(_row(c), ensure_ascii=False))
    elif found:
        print(_table(found))
    elif search is None:
        print("ddtree-chat: no saved conversations yet.", file=sys.stderr)
    else:
        print(f"ddtree-chat: no saved conversation matches {search!r}.", file=sys.stderr)
    return 1 if search is not None and not found else 0


def export_conversation(conversation_id: int, as_json: bool) -> int:
    """Print conversation `conversation_id` as Markdown (JSON with as_json), as /export writes it."""
    from .ui.export import to_json, to_markdown  # NOTE: no Textual behind these

    history = _open()
    try:
        conv = history.get(conversation_id) if history is not None else None
        if conv is None:
            raise ArchiveError(f"there is no conversation {conversation_id} (ddtree-chat --list shows the ids).")
        messages = history.messages(conversation_id)
    finally:
        if history is not None:
            history.close()
    sys.stdout.write(to_json(conv, messages) if as_json else to_markdown(conv, messages) + "\n")
    return 0
