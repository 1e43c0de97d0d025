"""Loading the engine off the UI thread, and the screen shown when it cannot be loaded."""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Center, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Static

from ddtree_chat.logs import log_path

PROGRESS_INTERVAL = 0.1  # s between progress messages; a checkpoint has thousands of tensors

log = logging.getLogger("ddtree_chat.ui")


class EngineProgress(Message):
    def __init__(self, done: int, total: int, what: str, recording: bool = False, compiling: bool = False):
        super().__init__()
        self.done, self.total, self.what = done, total, what
        self.recording = recording  # the CUDA graphs are being recorded
        self.compiling = compiling  # a first start compiles the GPU kernels


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
    if msg.compiling:
        return f"Compiling GPU kernels… {msg.done}/{msg.total} (first start only: later starts reuse them)"
    if msg.recording:
        return f"Recording CUDA graphs… {msg.done}/{msg.total} rounds"
    return f"Loading the model… {msg.done}/{msg.total} tensors"


def start_loading(factory: Callable, post: Callable[[Message], object]) -> threading.Thread:
    """Run factory(progress) in a daemon thread.

    NOTE: a daemon thread rather than a Textual worker: Engine.load cannot be interrupted,
    and quitting during a multi-minute load must not wait for it to finish.
    """
    last = [0.0]

    def progress(done: int, total: int, what: str = "") -> None:
        from ddtree_chat.engine.progress import Stage  # NOTE: the engine is loading: torch is imported by now

        now = time.monotonic()
        if now - last[0] >= PROGRESS_INTERVAL or done >= total:
            last[0] = now
            post(EngineProgress(done, total, what, recording=what is Stage.RECORDING, compiling=what is Stage.COMPILING))

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
