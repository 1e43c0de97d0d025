"""A small deterministic stand-in for ddtree_chat.engine.Engine (same public interface).

Used by the snapshot tests, where every pixel must be the same on every run: the real
engine's output is deterministic at T=0 but its timings are not.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

WORDS = ["<eos>", "<think>", "</think>", "\n", "The", " quick", " brown", " fox", " jumps", " over", " the", " lazy",
         " dog", ".", ",", " and", " a", " tree", " of", " drafts", " is", " verified", " by", " target", " model", " in",
         " ", " one", " forward", " pass", " speculative", " decoding", " works", " Let", " me", " think", "**", "`", "lazy"]


class FakeTokenizer:
    stop_ids = [0]

    def render_chat(self, messages, add_generation_prompt=True, thinking=True):
        ids = []
        for m in messages:
            ids += [3] + [4 + (ord(c) % (len(WORDS) - 4)) for c in m["content"]]
        if add_generation_prompt:
            ids += [3] + ([1] if thinking else [1, 2])
        return ids

    def decode(self, ids):
        return "".join(self.piece(i) for i in ids)

    def piece(self, token_id):
        return WORDS[token_id % len(WORDS)]


@dataclass
class FakeConfig:
    mode: str = "ddtree"
    budget: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    repeat_penalty: float = 1.0
    seed: int = 0
    max_new_tokens: int = 512


def _ids(text: str) -> list[int]:
    lookup = {w: i for i, w in enumerate(WORDS)}
    out = []
    for word in text.split("|"):
        out.append(lookup[word])
    return out


DEFAULT_REPLY = " Let| me| think| of| the| fox|</think>|The| quick| brown| fox| jumps| over| the| |**|lazy|**| dog|."


class FakeEngine:
    """Replies with `reply` (tokens joined by "|"), a few tokens per round, with a made-up tree."""

    def __init__(self, reply: str = DEFAULT_REPLY, delay: float = 0.0, has_drafter: bool = True, repeat: int = 1,
                 max_context: int = 4096):
        self.tokenizer = FakeTokenizer()
        self.reply_ids = _ids(reply) * repeat
        self.delay = delay
        self.prompts: list[list[int]] = []
        self.configs: list = []
        modes = ["ddtree", "dflash", "ar"] if has_drafter else ["ar"]
        self.info = {"model": "fake-tiny", "device": "cpu", "tp": 1, "has_drafter": has_drafter, "max_context": max_context, "modes": modes}

    @classmethod
    def load(cls, *args, progress=None, **kwargs):
        if progress:
            for i in range(4):
                progress(i + 1, 4, f"tensor {i}")
        return cls()

    def generate(self, prompt_ids, cfg, stop: threading.Event | None = None):
        from ddtree_chat.engine.errors import ContextLengthError

        max_context = self.info["max_context"]
        if len(prompt_ids) + 1 > max_context:  # NOTE: the engine's prefill refuses a prompt that fills the context
            raise ContextLengthError(f"the prompt has {len(prompt_ids)} tokens but the context holds {max_context}")
        self.prompts.append(list(prompt_ids))
        self.configs.append(cfg)
        rng = random.Random(cfg.seed if cfg.temperature > 0 else 0)  # NOTE: as the engine, greedy ignores the seed
        # Like the engine: the prompt's forward yields the first token as a "prefill" event (not a round).
        out: list[int] = self.reply_ids[:1]
        yield {"event": "round", "prefill": True, "token_ids": list(out), "text": self.tokenizer.decode([t for t in out if t != 0]),
               "accepted_length": 1, "tree": _tree(rng, [], 0), "budget": cfg.budget, "mode": cfg.mode, "elapsed_s": 0.01}
        rounds = 0
        limit = min(cfg.max_new_tokens, len(self.reply_ids), max_context - len(prompt_ids))
        stop_reason = "max_new_tokens" if limit < len(self.reply_ids) else "stop_token"
        if limit == max_context - len(prompt_ids) and limit < len(self.reply_ids):
            stop_reason = "context"
        while len(out) < limit:
            if stop is not None and stop.is_set():
                stop_reason = "stopped"
                break
            if self.delay:
                time.sleep(self.delay)
            take = min(1 + rounds % 4, limit - len(out)) if cfg.mode != "ar" else 1
            new = self.reply_ids[len(out): len(out) + take]
            rounds += 1
            out += new
            budget = 16 if cfg.budget == "auto" else cfg.budget
            yield {  # NOTE: like the engine, a stop token's text is never part of "text"
                "event": "round", "token_ids": new, "text": self.tokenizer.decode([t for t in new if t != 0]),
                "accepted_length": len(new), "tree": _tree(rng, new, budget if cfg.mode != "ar" else 0),
                "budget": budget, "mode": cfg.mode, "elapsed_s": 0.01,
            }
        yield {
            "event": "done", "token_ids": out, "text": self.tokenizer.decode([t for t in out if t != 0]), "rounds": rounds,
            "target_forwards": rounds + 1, "mean_accepted_length": len(out) / (rounds + 1),
            "tokens_per_second": 100.0 * len(out) / (rounds + 1), "stop_reason": stop_reason,
        }


def _tree(rng: random.Random, accepted: list[int], budget: int) -> dict:
    """Root + an accepted chain of len(accepted)-1 drafted nodes + rejected filler up to budget."""
    if budget <= 0:
        return {"tokens": [], "parents": [], "depth": [], "accepted_nodes": [], "draft_logprobs": [], "target_tokens": []}
    tokens, parents, depth, logp = [5], [-1], [0], [0.0]
    path = [0]
    for tok in accepted[:-1][:budget]:
        tokens.append(tok)
        parents.append(path[-1])
        depth.append(depth[path[-1]] + 1)
        logp.append(round(-0.1 * len(path), 3))
        path.append(len(tokens) - 1)
    while len(tokens) < budget + 1:
        p = rng.randrange(len(tokens))
        tokens.append(4 + rng.randrange(len(WORDS) - 4))
        parents.append(p)
        depth.append(depth[p] + 1)
        logp.append(round(logp[p] - 0.5 - rng.random() * 2, 3))
    target = [accepted[path.index(i) + 0] if i in path and path.index(i) < len(accepted) else tokens[i] for i in range(len(tokens))]
    return {"tokens": tokens, "parents": parents, "depth": depth, "accepted_nodes": path, "draft_logprobs": logp, "target_tokens": target}


# -- helpers shared by the UI tests ----------------------------------------------------------

async def wait_until(pilot, condition, timeout: float = 30.0, step: float = 0.02) -> None:
    """Let the app run until condition() holds (worker threads post from outside the loop)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {getattr(condition, '__name__', condition)}")
        await pilot.pause(step)


async def submit(pilot, text: str) -> None:
    """Put text in the chat input and press Enter (the real send path)."""
    from ddtree_chat.ui.chat_view import ChatInput

    box = pilot.app.query_one(ChatInput)
    box.focus()
    box.text = text
    await pilot.press("enter")
    await pilot.pause()


async def loaded(pilot) -> None:
    await wait_until(pilot, lambda: pilot.app.engine is not None)


async def reply(pilot, text: str) -> None:
    """Send text and wait for the whole reply."""
    app = pilot.app
    before = len(app.session.messages)
    await submit(pilot, text)
    await wait_until(pilot, lambda: len(app.session.messages) >= before + 2 and not app.generating)
    await pilot.pause()


def notes(app, kind: str | None = None) -> list[str]:
    """The text of the notes in the conversation (kind "error": only the errors)."""
    return [str(n.render()) for n in app.query(".note") if kind is None or n.has_class(kind)]


def fake_app(engine: FakeEngine | None = None, **kwargs):
    from ddtree_chat.ui.app import DDTreeChatApp

    engine = engine or FakeEngine()

    def factory(progress):
        for i in range(3):
            progress(i + 1, 3, f"tensor {i}")
        return engine

    return DDTreeChatApp(factory, config_cls=FakeConfig, model_label="fake-tiny", **kwargs)
