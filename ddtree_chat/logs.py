"""The app's one log: a rotating file in the user state dir, set up once per process by whichever starts
first (the CLI, or the TUI when started on its own). Tracebacks go there, never onto the terminal."""

from __future__ import annotations

import logging
from logging.handlers import RotatingFileHandler
from pathlib import Path

from ddtree_chat import paths

LOG_FILE = "ddtree-chat.log"
MAX_BYTES = 5 * 1024 * 1024  # then ddtree-chat.log.1, .2 (older ones go)
BACKUPS = 2
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_handler: RotatingFileHandler | None = None


def log_path() -> Path:
    return paths.state_dir() / LOG_FILE


def setup_logging() -> str | None:
    """Route every record (ours and other libraries') to the log file; a second call with the same state
    dir does nothing (another one moves the handler: tests change the dir). Returns a one-line warning when
    the file cannot be used (the app then runs without it)."""
    global _handler
    root = logging.getLogger()
    try:
        path = log_path()
        if _handler is not None and _handler.baseFilename == str(path.resolve()):
            return None
        handler = RotatingFileHandler(path, maxBytes=MAX_BYTES, backupCount=BACKUPS, encoding="utf-8")  # NOTE: opened now
    except OSError as err:
        quiet = logging.getLogger("ddtree_chat")
        if not any(isinstance(h, logging.NullHandler) for h in quiet.handlers):
            quiet.addHandler(logging.NullHandler())  # NOTE: else logging's last resort prints onto the terminal
        return f"No log file this session: {err.strerror or err} ({getattr(err, 'filename', None) or 'state dir'})."
    if _handler is not None:
        root.removeHandler(_handler)
        _handler.close()
    _handler = handler
    handler.setFormatter(logging.Formatter(FORMAT))
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    return None
