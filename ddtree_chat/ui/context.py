"""Fit a conversation into the model's context: drop the oldest turns, keep the system prompt and the latest ones.

When the history no longer fits, the window jumps forward by whole turns until the prompt
fits with SLACK of the room to spare: the next few turns then share the kept prefix, so
the engine reuses its cache for them instead of recomputing the prompt at every turn.
"""

from __future__ import annotations

from typing import Callable, Sequence

SLACK = 0.25  # the share of the prompt room left free after a trim


def reply_room(max_context: int, max_new_tokens: int) -> int:
    """Tokens kept free for the reply (a longer one stops at "context full"); +1: the prefill needs one slot past the prompt."""
    return min(max_new_tokens, max_context // 2) + 1


def window(roles: Sequence[str], start: int, count: Callable[[int], int], limit: int) -> int | None:
    """The index of the first message the model sees.

    roles: the messages' roles (the last is the user message being answered); count(i): the
    prompt's tokens when it starts at message i; limit: the most tokens the prompt may have.
    Returns `start` while that fits, else the first turn (a user message) after which the
    rest fits in limit * (1 - SLACK), else the last turn that fits at all; None when even
    the last user message alone does not fit.
    """
    if count(start) <= limit:
        return start
    fits = None
    for i in (i for i, role in enumerate(roles) if role == "user" and i > start):
        n = count(i)
        if n <= limit * (1 - SLACK):
            return i
        if fits is None and n <= limit:
            fits = i
    return fits
