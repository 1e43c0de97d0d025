"""Run engine.generate in a worker thread and hand the UI coalesced updates.

The engine yields one event per round; posting each one would let a fast model flood the
UI's message queue (and slow generation down with it). Instead the thread batches the
text and rounds that arrive within UPDATE_INTERVAL and posts one message per batch.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from textual.message import Message

UPDATE_INTERVAL = 0.05  # s: at most ~20 UI updates per second

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


def run_generation(engine, prompt_ids: list[int], config, stop: threading.Event, post: Callable[[Message], object], gen_id: int,
                   interval: float = UPDATE_INTERVAL) -> None:
    """Thread body. Every outcome ends in exactly one GenerationDone or GenerationFailed."""
    text_parts: list[str] = []
    rounds: list[dict] = []
    everything: list[str] = []
    last_post = 0.0
    tokenizer = getattr(engine, "tokenizer", None)
    try:
        for ev in engine.generate(prompt_ids, config, stop=stop):
            kind = ev.get("event")
            if kind == "round":
                text = strip_stop_text(ev.get("text", ""), ev.get("token_ids") or [], tokenizer)
                text_parts.append(text)
                everything.append(text)
                rounds.append(ev)
                now = time.monotonic()
                if now - last_post >= interval:
                    post(GenerationUpdate(gen_id, "".join(text_parts), rounds))
                    text_parts, rounds, last_post = [], [], now
            elif kind == "done":
                ev = dict(ev, text=strip_stop_text(ev.get("text", ""), ev.get("token_ids") or [], tokenizer))
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


def strip_stop_text(text: str, token_ids: list[int], tokenizer) -> str:
    """Drop the stop token's own text (e.g. "<|im_end|>") from the end of a reply's text."""
    if not token_ids or tokenizer is None or token_ids[-1] not in (getattr(tokenizer, "stop_ids", None) or ()):
        return text
    try:
        stop_text = tokenizer.decode([token_ids[-1]])
    except Exception:  # noqa: BLE001 - cosmetic only
        return text
    return text[: -len(stop_text)] if stop_text and text.endswith(stop_text) else text
