"""Run engine.generate in a worker thread and hand the UI coalesced updates.

The engine yields one event per round; posting each one would let a fast model flood the
UI's message queue (and slow generation down with it). Instead the thread batches the
text and rounds that arrive within UPDATE_INTERVAL and posts one message per batch.

Each update costs the UI thread CPU time (re-parsing the Markdown block being written
grows with its length), and on a CPU-bound engine that time is taken from generation.
So the batching also adapts: the next update waits until the UI thread's CPU time since
the previous one is at most UI_SHARE of the wall time (measured with the UI thread's CPU
clock), i.e. slow updates become rarer instead of slowing the engine down.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from textual.message import Message

UPDATE_INTERVAL = 0.05  # s: at most ~20 UI updates per second
UI_SHARE = 0.05  # the most of the wall time the UI thread may spend on updates while generating
MAX_INTERVAL = 0.5  # s: however slow the UI, the reply still moves at least twice a second

log = logging.getLogger("ddtree_chat.ui")


class GenerationUpdate(Message):
    def __init__(self, gen_id: int, text: str, rounds: list[dict]):
        super().__init__()
        self.gen_id = gen_id
        self.text = text
        self.rounds = rounds


class GenerationDone(Message):
    def __init__(self, gen_id: int, done: dict):
        super().__init__()
        self.gen_id = gen_id
        self.done = done


class GenerationFailed(Message):
    def __init__(self, gen_id: int, error: BaseException, text: str):
        super().__init__()
        self.gen_id = gen_id
        self.error = error
        self.text = text  # what had been generated before the failure


class _Pacer:
    """Decides when the next update may go out (see the module docstring)."""

    def __init__(self, interval: float, ui_thread: int | None, share: float | None = None):
        self.interval, self.share = interval, (UI_SHARE if share is None else share)
        try:
            self.clock = time.pthread_getcpuclockid(ui_thread) if ui_thread is not None else None
        except (AttributeError, OSError):  # not on this platform: fixed interval only
            self.clock = None
        self.last_post = 0.0
        self.ui_cpu = self._ui_cpu()

    def _ui_cpu(self) -> float:
        try:
            return time.clock_gettime(self.clock) if self.clock is not None else 0.0
        except OSError:
            self.clock = None
            return 0.0

    def ready(self) -> bool:
        now = time.monotonic()
        waited = now - self.last_post
        if waited < self.interval:
            return False
        return self.clock is None or waited >= MAX_INTERVAL or (self._ui_cpu() - self.ui_cpu) <= self.share * waited

    def posted(self) -> None:
        self.last_post = time.monotonic()
        self.ui_cpu = self._ui_cpu()


def run_generation(engine, prompt_ids: list[int], config, stop: threading.Event, post: Callable[[Message], object], gen_id: int,
                   interval: float = UPDATE_INTERVAL, ui_thread: int | None = None) -> None:
    """Thread body. Every outcome ends in exactly one GenerationDone or GenerationFailed."""
    text_parts: list[str] = []
    rounds: list[dict] = []
    everything: list[str] = []
    pacer = _Pacer(interval, ui_thread)
    try:
        for ev in engine.generate(prompt_ids, config, stop=stop):
            kind = ev.get("event")
            if kind == "round":
                text = ev.get("text", "")  # NOTE: the engine never includes a stop token's text
                text_parts.append(text)
                everything.append(text)
                rounds.append(ev)
                if pacer.ready():
                    post(GenerationUpdate(gen_id, "".join(text_parts), rounds))
                    text_parts, rounds = [], []
                    pacer.posted()
            elif kind == "done":
                if text_parts or rounds:
                    post(GenerationUpdate(gen_id, "".join(text_parts), rounds))
                post(GenerationDone(gen_id, ev))
                return
        # A generator that ends without "done" still ends the reply cleanly.
        if text_parts or rounds:
            post(GenerationUpdate(gen_id, "".join(text_parts), rounds))
        post(GenerationDone(gen_id, {"event": "done", "text": "".join(everything), "stop_reason": "stopped"}))
    except Exception as err:  # noqa: BLE001 - shown to the user, traceback to the log
        log.exception("generation failed")
        post(GenerationFailed(gen_id, err, "".join(everything)))
