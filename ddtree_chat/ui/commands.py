"""Slash commands typed in the input, and the same actions as command-palette entries.

The app provides: `settings`, `set_setting(name, value) -> str`, `new_chat()`,
`export_conversation(path|None)`, `save_defaults()`, `note(text, kind)`,
`action_conversations()`, `action_toggle_debug()`, `prefill(text)`, `retry()`, `edit()`, `copy(what)`.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import SystemCommand

from ddtree_chat.modes import BUDGETS, MAX_BUDGET, MAX_REPEAT_PENALTY, MODES, REPEAT_WINDOW
from ddtree_chat.settings import SettingsError

# (command, argument, what it does) — /help prints this table
COMMANDS = [
    ("/help", "", "list commands and keys"),
    ("/system", "TEXT", "set the system prompt (no TEXT: show it; /system clear: remove it)"),
    ("/temp", "X", "sampling temperature (0 = greedy)"),
    ("/top_p", "X", "nucleus sampling threshold, 0 < X ≤ 1"),
    ("/repeat", "X", f"make tokens among the last {REPEAT_WINDOW} less likely, 1 ≤ X ≤ {MAX_REPEAT_PENALTY:g} (1 = off)"),
    ("/max", "N", "max new tokens per reply"),
    ("/mode", "ddtree|dflash|ar", "decoding mode"),
    ("/budget", "N|auto", f"DDTree node budget ({BUDGETS.start}-{MAX_BUDGET}, or auto)"),
    ("/seed", "N|random", "sampling seed (random: a new one each reply)"),
    ("/think", "on|off", "let the model think before answering"),
    ("/retry", "", "write the last reply again (replaces it)"),
    ("/edit", "", "put your last message back in the input: Enter resends it in place of the old turn, Esc cancels"),
    ("/copy", "[code]", "copy the last reply (code: its last code block) to the clipboard"),
    ("/new", "", "start a new conversation"),
    ("/list", "", "saved conversations (open, search, delete)"),
    ("/rename", "TITLE", "rename this conversation"),
    ("/export", "[PATH]", "export this conversation to Markdown (JSON when PATH ends in .json); never overwrites"),
    ("/save", "", "save the current settings as defaults"),
    ("/settings", "", "show the current settings"),
]
ALIASES = {"/temperature": "/temp", "/max_new_tokens": "/max", "/thinking": "/think", "/top-p": "/top_p",
           "/repeat_penalty": "/repeat", "/repeat-penalty": "/repeat", "/quit": "/quit"}
SETTING_OF = {"/temp": "temperature", "/top_p": "top_p", "/repeat": "repeat_penalty", "/max": "max_new_tokens",
              "/mode": "mode", "/budget": "budget", "/seed": "seed", "/think": "thinking"}

KEYS = [
    ("enter", "send"), ("ctrl+j", "newline in the input (also shift+enter where the terminal reports it)"),
    ("esc", "stop the reply (keeps what was generated)"), ("f2", "toggle the round-detail debug pane"),
    ("f3 / f4", "previous / next round in the debug pane ([ ] { } when its table has focus)"),
    ("up / down", "in an empty input: your earlier messages in this chat"),
    ("pgup / pgdn", "scroll the conversation"), ("ctrl+r", "copy the last reply"), ("ctrl+b", "copy its last code block"),
    ("ctrl+n", "new chat"), ("ctrl+o", "conversations"),
    ("ctrl+t", "show/hide the DDTree panel (below the chat when the window is narrow)"),
    ("ctrl+p", "command palette"), ("ctrl+q", "quit"),
]


def help_table() -> Table:
    """Commands and keys in two columns: a long description wraps under itself, not under the names."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column()
    for title, rows in (("Commands:", [((c + " " + a).strip(), d) for c, a, d in COMMANDS]), ("Keys:", KEYS)):
        grid.add_row(Text(title), Text(""))
        for name, what in rows:
            grid.add_row(Text("  " + name), Text(what))  # NOTE: Text, not str: "[ ]" is no markup here
    return grid


def is_command(text: str) -> bool:
    first = text.strip().split(maxsplit=1)[0] if text.strip() else ""
    return first.startswith("/") and len(first) > 1 and "/" not in first[1:]


def run_command(app, text: str) -> None:
    """Execute one slash command; every outcome is reported in the conversation."""
    parts = text.strip().split(maxsplit=1)
    name, arg = parts[0].lower(), (parts[1].strip() if len(parts) > 1 else "")
    name = ALIASES.get(name, name)
    try:
        if name == "/help":
            app.note(help_table())
        elif name == "/system":
            if not arg:
                current = app.settings.system
                app.note(f"System prompt: {current}" if current else "No system prompt. Set one with /system TEXT.")
            else:
                app.note(app.set_setting("system", "" if arg.lower() in ("clear", "none", "off") else arg))
        elif name in SETTING_OF:
            if not arg:
                raise SettingsError(f"{name} needs a value: {name} {next(a for c, a, _ in COMMANDS if c == name)}.")
            app.note(app.set_setting(SETTING_OF[name], arg))
        elif name == "/retry":
            app.retry()
        elif name == "/edit":
            app.edit()
        elif name == "/copy":
            if arg not in ("", "code"):
                raise SettingsError("/copy copies the last reply; /copy code its last code block.")
            app.copy(arg)
        elif name == "/new":
            app.new_chat()
        elif name == "/list":
            app.action_conversations()
        elif name == "/rename":
            if not arg:
                raise SettingsError("/rename needs a title: /rename TITLE.")
            renamed = app.session.rename(arg)
            app.note(f"Renamed this conversation to “{app.session.title}”." if renamed
                     else "Nothing to rename yet: the conversation is saved with its first message.")
        elif name == "/export":
            app.export_conversation(arg or None)
        elif name == "/save":
            app.save_defaults()
        elif name == "/settings":
            app.note(describe(app.settings))
        elif name == "/quit":
            app.exit()
        else:
            app.note(f"Unknown command {name}. Type /help for the list.", "error")
    except SettingsError as err:
        app.note(str(err), "error")


def describe(settings) -> str:
    return (
        f"mode {settings.mode or 'auto'} · budget {settings.budget} · temperature {settings.temperature:g} · "
        f"top_p {settings.top_p:g} · repeat_penalty {settings.repeat_penalty:g} · max {settings.max_new_tokens} · "
        f"seed {settings.seed} · thinking {'on' if settings.thinking else 'off'} · "
        f"system prompt {'set' if settings.system else 'none'}"
    )


def palette_commands(app):
    """Command-palette entries; the ones that need a value prefill the input with the command."""

    def setter(name, value):
        return lambda: app.note(app.set_setting(name, value))

    for mode in MODES:
        yield SystemCommand(f"Mode: {mode}", f"decode with {mode}", setter("mode", mode))
    yield SystemCommand("Thinking: on", "let the model think before answering", setter("thinking", True))
    yield SystemCommand("Thinking: off", "answer directly", setter("thinking", False))
    for label, cmd in (("Set system prompt…", "/system "), ("Set temperature…", "/temp "), ("Set top-p…", "/top_p "),
                       ("Set repeat penalty…", "/repeat "), ("Set max new tokens…", "/max "),
                       ("Set tree budget…", "/budget "), ("Set seed…", "/seed "), ("Export conversation to…", "/export ")):
        yield SystemCommand(label, f"type {cmd.strip()} VALUE in the input", lambda cmd=cmd: app.prefill(cmd))
    yield SystemCommand("Retry", "write the last reply again", app.retry)
    yield SystemCommand("Edit last message", "put it back in the input; Enter resends it", app.edit)
    yield SystemCommand("Copy reply", "the last reply to the clipboard", app.copy)
    yield SystemCommand("Copy code", "the last reply's last code block to the clipboard", lambda: app.copy("code"))
    yield SystemCommand("New chat", "start a new conversation", app.new_chat)
    yield SystemCommand("Conversations", "open or delete saved conversations", app.action_conversations)
    yield SystemCommand("Export conversation", "write it as Markdown under the data dir", lambda: app.export_conversation(None))
    yield SystemCommand("Save settings as defaults", "used on the next start", app.save_defaults)
    yield SystemCommand("Toggle debug pane", "one round of the tree in full", app.action_toggle_debug)
    yield SystemCommand("Show settings", "current generation settings", lambda: app.note(describe(app.settings)))
    yield SystemCommand("Help", "slash commands and keys", lambda: app.note(help_table()))
