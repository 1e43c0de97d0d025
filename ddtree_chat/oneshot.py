"""One reply from the command line: the answer alone on stdout; thinking (--show-thinking), notes and the
stats line on stderr; the exchange saved as a conversation that -c / --conversation can continue."""

from __future__ import annotations

import json
import signal
import sqlite3
import sys
import threading
import time

from . import settings as settings_mod
from .ui.thinking import ThinkSplitter  # NOTE: plain Python (no Textual), shared with the chat view

# Saved with a conversation and restored by --continue (the model to load is not part of a conversation).
CONVERSATION_FIELDS = ("system", "temperature", "top_p", "repeat_penalty", "max_new_tokens", "mode", "budget",
                       "thinking", "seed")


def _note(text: str) -> None:
    print(f"ddtree-chat: {text}", file=sys.stderr, flush=True)


class _Store:
    """The conversation this exchange goes into; saving problems are one warning, then the reply goes on."""

    def __init__(self, args):
        self.history = self.id = None
        self.save = args.save and not args.raw  # NOTE: a raw completion is not a chat turn
        self._warned = False
        if not (self.save or args.continue_ or args.conversation is not None):
            return
        from .history import History

        try:
            self.history = History.open()
        except (OSError, sqlite3.Error) as err:
            if args.continue_ or args.conversation is not None:
                raise OSError(f"cannot open the conversations to continue one: {err}") from None
            _note(f"{err}; this exchange is not saved.")
            return
        if self.history.warning:
            _note(self.history.warning)
        if args.conversation is not None:
            if self.history.get(args.conversation) is None:
                raise ValueError(f"there is no conversation {args.conversation} (the chat's list, ctrl+o, shows the ids).")
            self.id = args.conversation
        elif args.continue_:
            latest = self.history.conversations()
            self.id = latest[0].id if latest else None  # nothing to continue: a new conversation

    def past(self) -> tuple[list[dict], dict]:
        """(the earlier turns as chat messages, the settings saved with the conversation)."""
        if self.id is None:
            return [], {}
        turns = [{"role": m.role, "content": m.content} for m in self.history.messages(self.id)
                 if m.role in ("user", "assistant")]
        conv = self.history.get(self.id)
        return turns, conv.settings if conv is not None and isinstance(conv.settings, dict) else {}

    def _write(self, fn, *args):
        if not self.save or self.history is None:
            return None
        try:
            return fn(*args)
        except (OSError, sqlite3.Error) as err:
            if not self._warned:
                self._warned = True
                _note(f"could not save to the conversation database ({err}); this exchange is not saved.")
            self.save = False
            return None

    def add_user(self, text: str, title: str, settings: dict) -> None:
        if self.id is None:
            self.id = self._write(self.history.new_conversation, title, settings) if self.history else None
        if self.id is not None:
            self._write(self.history.add_message, self.id, "user", text)

    def add_assistant(self, answer: str, thinking: str, meta: dict) -> None:
        if self.id is not None:
            self._write(self.history.add_message, self.id, "assistant", answer, thinking, meta)


def _restored(saved: settings_mod.Settings, stored: dict) -> settings_mod.Settings:
    """The defaults with a continued conversation's own settings on top (values no longer valid are skipped)."""
    changes = {}
    for name in CONVERSATION_FIELDS:
        if name in stored:
            try:
                changes[name] = settings_mod.validate(name, stored[name])
            except settings_mod.SettingsError:
                pass
    return saved.replace(**changes)


def _title(text: str) -> str:
    first = next((line.strip() for line in text.splitlines() if line.strip()), "One-shot")
    return first if len(first) <= 60 else first[:59] + "…"


class _Interrupt:
    """Ctrl+C during a reply ends it after the current round (the engine stays in step); a second one
    interrupts at once."""

    def __init__(self):
        self.stop = threading.Event()
        self._previous = None

    def _handle(self, signum, frame):
        self.stop.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        return False


def stats_line(done: dict, seed: int | None = None) -> str:
    """The reply's figures for stderr; seed: the sampling seed, shown when it mattered (T > 0)."""
    prompt_n, prompt_s = done.get("prompt_tokens", 0), done.get("prompt_s", 0.0)
    prompt_rate = f"{prompt_n / prompt_s:.1f}" if prompt_s > 0 else "-"
    return (f"[{done['mode']}] prompt {prompt_n} tokens in {prompt_s:.2f}s ({prompt_rate} tok/s) · "
            f"reply {len(done['token_ids'])} tokens in {done['elapsed_s']:.2f}s, {done['tokens_per_second']:.1f} tok/s, "
            f"{done['mean_accepted_length']:.2f} tokens/forward, {done['rounds']} rounds · "
            f"load {done.get('load_s', 0.0):.2f}s · stop: {done['stop_reason']}"
            + (f" · seed {seed}" if seed is not None else ""))


def run_oneshot(args, text: str, saved: settings_mod.Settings) -> int:
    from .bootstrap import generation_config, load_engine
    from .engine.default_model import random_fallback_note
    from .ui.replies import meta_for

    store = _Store(args)
    past, conv_settings = store.past()
    settings, _ = settings_mod.with_overrides(_restored(saved, conv_settings), args)  # NOTE: flags were validated when parsed
    note = random_fallback_note(args.model)
    if note:
        _note(note)
    t0 = time.perf_counter()
    engine = load_engine(args)
    load_s = time.perf_counter() - t0
    drawn = settings_mod.with_seed(settings)  # NOTE: the conversation keeps "random"; the reply keeps its own seed
    cfg = generation_config(drawn, engine.drafter is not None, mode_given=args.mode is not None)
    if args.raw:
        ids = engine.tokenizer.encode(text)
    else:
        ids = _chat_ids(engine, settings, past, text, cfg.max_new_tokens)

    splitter = ThinkSplitter(in_think=settings.thinking and not args.raw)
    done = None
    with _Interrupt() as interrupt:
        for ev in engine.generate(ids, cfg, stop=interrupt.stop):
            if ev.get("prefill"):  # NOTE: saved once the prompt fits and ran, so a failed prompt leaves no orphan turn
                store.add_user(text, _title(text), {k: getattr(settings, k) for k in CONVERSATION_FIELDS})
            if ev["event"] == "done":
                ev = done = dict(ev, load_s=load_s, seed=drawn.seed)  # NOTE: --seed with it writes this reply again
                if interrupt.stop.is_set():
                    done["stop_reason"] = "interrupted"
                _show(splitter, ev["tail_text"], args)
                _show(splitter, None, args)
            else:
                _show(splitter, ev["text"], args)
            if args.json:
                print(json.dumps(ev, ensure_ascii=False), flush=True)
    if not args.json:
        sys.stdout.write("\n" if not splitter.answer.endswith("\n") else "")
        sys.stdout.flush()
    if splitter.in_think and not splitter.answer and not args.json:
        _note("the reply ended while the model was still thinking: no answer (--show-thinking shows the thinking).")
    meta = meta_for(done, drawn)
    if done["stop_reason"] == "interrupted":
        meta["stop_reason"] = "stopped"  # NOTE: what the chat calls a reply cut short
    store.add_assistant(splitter.answer.strip(), splitter.thinking.strip(), meta)
    print(stats_line(done, drawn.seed if drawn.temperature > 0 else None), file=sys.stderr, flush=True)
    if done["stop_reason"] == "interrupted":
        _note("interrupted.")
        return 130
    return 0


def _chat_ids(engine, settings, past: list[dict], text: str, max_new_tokens: int) -> list[int]:
    """The chat prompt; a continued conversation too long for the context loses its oldest turns (the system
    prompt stays), so the prompt leaves room for the reply."""
    system = [{"role": "system", "content": settings.system}] if settings.system.strip() else []
    context = engine.info["max_context"]
    room = context - min(max_new_tokens, context // 2)
    kept = past
    while True:
        ids = engine.tokenizer.render_chat(system + kept + [{"role": "user", "content": text}],
                                           add_generation_prompt=True, thinking=settings.thinking)
        if len(ids) <= room or not kept:
            break
        kept = kept[1:]
        while kept and kept[0]["role"] != "user":  # a turn is a question and its answer
            kept = kept[1:]
    if len(kept) < len(past):
        _note(f"left out the {len(past) - len(kept)} oldest messages of this conversation to fit the context "
              f"({context} tokens).")
    return ids


def _show(splitter: ThinkSplitter, text: str | None, args) -> None:
    """Answer text to stdout, thinking to stderr when asked; None flushes a held-back partial tag."""
    think, answer = splitter.flush() if text is None else splitter.feed(text)
    if args.json:
        return
    if think and args.show_thinking:
        sys.stderr.write(think)
        sys.stderr.flush()
    if answer:
        if args.show_thinking and splitter.thinking and answer == splitter.answer:
            sys.stderr.write("\n")  # the thinking ends before the first answer text
        sys.stdout.write(answer)
        sys.stdout.flush()
