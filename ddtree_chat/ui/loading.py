"""Loading the engine off the UI thread, and the screen shown when it cannot be loaded."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Center, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Static

from ddtree_chat import paths

LOG_FILE = "ddtree-chat.log"
PROGRESS_INTERVAL = 0.1  # s between progress messages; a checkpoint has thousands of tensors

log = logging.getLogger("ddtree_chat.ui")


def log_path() -> Path:
    return paths.state_dir() / LOG_FILE


_handler: logging.FileHandler | None = None


def setup_logging() -> str | None:
    """Tracebacks go to a file under the user state dir, never onto the screen.

    Returns a one-line warning when that file cannot be used (the app then runs without it).
    """
    global _handler
    try:
        path = log_path()
        resolved = str(path.resolve())
        root = logging.getLogger("ddtree_chat")
        if _handler is not None and _handler.baseFilename == resolved:
            return None
        if any(getattr(h, "baseFilename", None) == resolved for h in logging.getLogger().handlers):
            return None  # the CLI already logs there (records propagate to the root logger)
        handler = logging.FileHandler(path, encoding="utf-8")  # NOTE: opened now, so an unwritable file fails here
    except OSError as err:
        quiet = logging.getLogger("ddtree_chat")
        if not any(isinstance(h, logging.NullHandler) for h in quiet.handlers):
            quiet.addHandler(logging.NullHandler())  # NOTE: else logging's last resort prints onto the TUI
        return f"No log file this session: {err.strerror or err} ({getattr(err, 'filename', None) or 'state dir'})."
    if _handler is not None:  # the state dir changed (tests): move the one handler we own
        root.removeHandler(_handler)
        _handler.close()
    _handler = handler
    _handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(_handler)
    root.setLevel(logging.INFO)
    return None


class EngineProgress(Message):
    def __init__(self, done: int, total: int, what: str):
        super().__init__()
        self.done, self.total, self.what = done, total, what


class EngineReady(Message):
    def __init__(self, engine, seconds: float):
        super().__init__()
        self.engine = engine
        self.seconds = seconds


class EngineFailed(Message):
    def __init__(self, message: str):
        super().__init__()
        self.message = message


def loading_label(msg: EngineProgress) -> str:
    from ddtree_chat.engine.graphs import RECORDING  # NOTE: torch is imported by now (the engine is loading)

    if msg.what == RECORDING:  # NOTE: a first start compiles the GPU kernels inside this step
        return f"Recording CUDA graphs… {msg.done}/{msg.total} rounds (the first start also compiles GPU kernels)"
    return f"Loading the model… {msg.done}/{msg.total} tensors"


def start_loading(factory: Callable, post: Callable[[Message], object]) -> threading.Thread:
    """Run factory(progress) in a daemon thread.

    NOTE: a daemon thread rather than a Textual worker: Engine.load cannot be interrupted,
    and quitting during a multi-minute load must not wait for it to finish.
    """
    last = [0.0]

    def progress(done: int, total: int, what: str = "") -> None:
        now = time.monotonic()
        if now - last[0] >= PROGRESS_INTERVAL or done >= total:
            last[0] = now
            post(EngineProgress(done, total, what))

    def body() -> None:
        start = time.monotonic()
        try:
            engine = factory(progress)
        except Exception as err:  # noqa: BLE001 - every failure becomes a readable screen
            log.exception("loading the model failed")
            post(EngineFailed(describe_error(err)))
            return
        post(EngineReady(engine, time.monotonic() - start))

    thread = threading.Thread(target=body, name="ddtree-load", daemon=True)
    thread.start()
    return thread


def describe_error(err: BaseException) -> str:
    try:
        from ddtree_chat.engine.errors import EngineError
    except ImportError:  # pragma: no cover - errors.py ships with the package
        EngineError = ()  # type: ignore[assignment]
    if isinstance(err, EngineError):
        return str(err)
    if isinstance(err, FileNotFoundError):
        return f"File or folder not found: {err.filename or err}. Check the --model and --draft paths."
    if isinstance(err, MemoryError):
        return "Out of memory while loading the model; try a smaller model or free some memory."
    return f"Unexpected error while loading the model: {type(err).__name__}: {err}"


def _details() -> str:
    try:
        return f"Details were written to {log_path()}."
    except OSError:
        return "No log file could be written."


class ErrorScreen(Screen):
    """A readable message in place of a traceback; the traceback is in the log file."""

    BINDINGS = [Binding("q,escape,enter", "app.quit", "Quit")]

    def __init__(self, title: str, message: str):
        super().__init__()
        self.title_text = title
        self.message = message

    def compose(self) -> ComposeResult:
        with Center():
            with Vertical(id="error-box"):
                yield Static(self.title_text, id="error-title", markup=False)
                yield Static(self.message, id="error-message", markup=False)
                yield Static(f"{_details()}\nPress q to quit.", id="error-hint", markup=False)
        yield Footer()
