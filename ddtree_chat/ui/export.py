"""A conversation written out as Markdown or JSON (`/export PATH`, PATH.json for JSON).

An export never overwrites a file and never creates a folder the user named: both are
refused with one sentence (ExportError), so a typo cannot clobber or scatter files.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ddtree_chat.history import Conversation, Message

NAMES = {"system": "System", "user": "You", "assistant": "Assistant"}
SETTING_KEYS = ("system", "mode", "budget", "temperature", "top_p", "repeat_penalty", "max_new_tokens", "seed", "thinking")


class ExportError(Exception):
    """str(err) is the one line shown to the user."""


def _balanced(text: str) -> str:
    """Close a code fence a stopped reply left open, so the rest of the file stays Markdown."""
    fences = sum(1 for line in text.splitlines() if line.lstrip().startswith("```"))
    return text + "\n```" if fences % 2 else text


def to_markdown(conv: Conversation, messages: list[Message]) -> str:
    out = [f"# {conv.title}", ""]
    settings = {k: conv.settings[k] for k in SETTING_KEYS if conv.settings.get(k) is not None and k != "system"}
    if settings:
        out += ["*" + " · ".join(f"{k} {v}" for k, v in settings.items()) + "*", ""]
    if conv.settings.get("system"):
        out += ["## System", "", conv.settings["system"].rstrip(), ""]
    for m in messages:
        out += [f"## {NAMES.get(m.role, m.role)}", ""]
        if m.thinking.strip():
            quoted = "\n".join("> " + line for line in _balanced(m.thinking.strip()).splitlines())
            out += ["<details><summary>Thinking</summary>", "", quoted, "", "</details>", ""]
        body = m.content.strip() if m.role == "assistant" else m.content.rstrip()
        out += [_balanced(body), ""]
        if (m.meta or {}).get("stop_reason") in ("stopped", "quit"):
            out += ["*(stopped)*", ""]
    return "\n".join(out)


def to_json(conv: Conversation, messages: list[Message]) -> str:
    data = {
        "id": conv.id, "title": conv.title, "created": conv.created, "updated": conv.updated,
        "settings": {k: conv.settings[k] for k in SETTING_KEYS if k in conv.settings},
        "messages": [{"role": m.role, "content": m.content, "thinking": m.thinking,
                      **({"stats": m.meta} if m.role == "assistant" else {})} for m in messages],
    }
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def default_path(folder: Path, conv: Conversation) -> Path:
    return folder / f"conversation-{conv.id}-{time.strftime('%Y%m%d-%H%M%S')}.md"


def write(conv: Conversation, messages: list[Message], path: Path) -> Path:
    """Write the export to `path` (JSON when it ends in .json); refuse to overwrite or create folders."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise ExportError(f"{path} is a folder; give a file name, e.g. /export {path / 'chat.md'}.")
    if path.exists():
        raise ExportError(f"{path} already exists; not overwriting it (choose another name).")
    if not path.parent.is_dir():
        raise ExportError(f"The folder {path.parent} does not exist; create it first (nothing was written).")
    text = to_json(conv, messages) if path.suffix.lower() == ".json" else to_markdown(conv, messages)
    try:
        with open(path, "x", encoding="utf-8") as f:  # NOTE: "x": a file created meanwhile is not overwritten either
            f.write(text)
    except FileExistsError:
        raise ExportError(f"{path} already exists; not overwriting it (choose another name).") from None
    except OSError as err:
        raise ExportError(f"Could not write {path}: {err.strerror or err}.") from None
    return path
