"""How often the target, while it trains, writes `def NAME(` for the function a validation request names.

Why: the held-out requests need the requested name copied from the prompt, and the first distilled targets
answered under memorised or invented names (docs/demo-training.md). The validation loss does not show the
copy (the name is a few tokens of each answer); a cheap batched greedy continuation of a few dozen
validation requests does, so a run shows whether and when the copy forms.

The validation requests name standard-library functions the training data has seen, so the copy rate ran ahead
of the held-out figure (26-28/32 copied while 1-3 of the 20 held-out requests were defined); the held-out probe
answers prompts.HELDOUT itself, with eval_heldout.py's prompts and scoring."""

from __future__ import annotations

import re
from typing import Callable

import torch

from .prompts import HELDOUT, evaluate, has_def_line

REQUESTED = re.compile(r"\bfunction (\w+)\(")  # the generator's function requests: "... function NAME(args) ..."


def function_requests(prompts: list[tuple], limit: int, suffix: list[int]) -> list[tuple[list[int], str]]:
    """(prompt ids + suffix, requested name) of the first `limit` chat prompts (id, user, answer, ids) that
    ask for a function by name."""
    out = []
    for _, user, _, ids in prompts:
        if len(out) == limit:
            break
        if m := REQUESTED.search(user):
            out.append((list(ids) + suffix, m.group(1)))
    return out


@torch.no_grad()
def greedy(logits_fn: Callable[[torch.Tensor], torch.Tensor], prompts: list[list[int]], new: int, pad: int,
           device) -> list[list[int]]:
    """`new` greedy tokens after each prompt, all rows in one batch: rows are right-padded (under causal
    attention a row's real tokens never see its padding) and each step reads the logits at the row's own
    last token. logits_fn: [B, T] ids -> [B, T, V] logits."""
    lens = torch.tensor([len(p) for p in prompts], device=device)
    buf = torch.full((len(prompts), int(lens.max()) + new), pad, dtype=torch.long, device=device)
    for i, p in enumerate(prompts):
        buf[i, : len(p)] = torch.tensor(p, device=device)
    rows = torch.arange(len(prompts), device=device)
    for _ in range(new):
        logits = logits_fn(buf[:, : int(lens.max())])
        buf[rows, lens] = logits[rows, lens - 1].float().argmax(-1)
        lens += 1
    return [buf[i, len(p) : len(p) + new].tolist() for i, p in enumerate(prompts)]


def copy_rate(logits_fn, requests: list[tuple[list[int], str]], decode: Callable[[list[int]], str],
              stop_ids: tuple[int, ...], pad: int, device, new: int = 64) -> int:
    """How many of the requests' greedy answers (cut at the first stop token) have a `def NAME(` line."""
    if not requests:
        return 0
    hits = 0
    for out, (_, name) in zip(greedy(logits_fn, [p for p, _ in requests], new, pad, device), requests):
        cut = next((i for i, t in enumerate(out) if t in stop_ids), len(out))
        hits += has_def_line(decode(out[:cut]), name)
    return hits


def heldout_prompts(tok) -> list[list[int]]:
    """The held-out requests' prompt ids for the engine (engine tokenizer `tok`): eval_heldout.py's and the probe's."""
    return [tok.render_chat([{"role": "user", "content": h.prompt}], add_generation_prompt=True, thinking=False)
            for h in HELDOUT]


def heldout_rate(logits_fn, tok, pad: int, device, new: int = 160) -> dict:
    """prompts.evaluate's counts (n, defines, passes, def_line) over the greedy answers to the held-out
    requests, each cut at its first stop token and decoded as the engine's reply text is."""
    replies = []
    for out in greedy(logits_fn, heldout_prompts(tok), new, pad, device):
        cut = next((i for i, t in enumerate(out) if t in tok.stop_ids), len(out))
        replies.append(tok.decode(out[:cut]))
    res = evaluate(replies, timeout=2.0)  # a short cap: a looping answer must not stall training
    return {k: res[k] for k in ("n", "defines", "passes", "def_line")}
