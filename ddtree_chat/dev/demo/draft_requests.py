"""The drafter's requests: the chat requests whose target continuations the drafter trains on.

Two sources, mixed by a share: the prompt generator under another seed (standard-library function requests,
explanations, fixes, general questions: what the first data set asks), and requests of the held-out kind,
everyday utility functions, asked in phrasings the target was not trained on: every task of the everyday
sets in every function phrasing, less the prompts of the training split. The held-out requests' replies
are prose around short code; a drafter that learnt only the generator's kind guessed them far less well
than its validation said (docs/demo-training.md, "The shipped pair")."""

from __future__ import annotations

import random

from . import everyday, everyday2, everyday3
from .prompts import EXTRA_TEMPLATES, FUNCTION_TEMPLATES, HELDOUT_NAMES, PromptGen, prompt_id, request_text


def everyday_requests(seed: int, exclude: set[str]) -> list[str]:
    """Every everyday task in every function phrasing, less prompts whose id is in `exclude` (the training
    split's) or that hold a held-out name; distinct, in a seeded order."""
    tasks = everyday.tasks() + everyday2.tasks() + everyday3.tasks()
    out, seen = [], set(exclude)
    for name, args, does in tasks:
        for template in FUNCTION_TEMPLATES + EXTRA_TEMPLATES:
            user = request_text(template, name, args, does)
            pid = prompt_id(user)
            if pid not in seen and not any(h in user for h in HELDOUT_NAMES):
                seen.add(pid)
                out.append(user)
    random.Random(seed).shuffle(out)
    return out


def draft_requests(n: int, seed: int, exclude: set[str], everyday_share: float, funcs=None) -> list[str]:
    """n distinct requests (fewer when both sources run dry): a share `everyday_share` of the held-out kind
    (everyday_requests), the rest from PromptGen(seed, funcs=funcs), none in `exclude`, the two kinds
    interleaved in a seeded order."""
    kind = everyday_requests(seed, exclude)[: round(n * everyday_share)]
    taken = set(exclude) | {prompt_id(u) for u in kind}
    rest = [p["user"] for p in PromptGen(seed, funcs=funcs).sample(n - len(kind), exclude=taken)]
    out = kind + rest
    random.Random(seed + 1).shuffle(out)
    return out
