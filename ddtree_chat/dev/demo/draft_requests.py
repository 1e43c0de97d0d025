"""The drafter's requests: the chat requests whose target continuations the drafter trains on.

Three sources, mixed by shares: the prompt generator under another seed (standard-library function requests,
explanations, fixes, general questions: what the first data set asks), requests of the held-out kind,
everyday utility functions, asked in phrasings the target was not trained on: every task of the everyday
sets in every function phrasing, less the prompts of the training split, and (optionally) tasks the target
never trained on at all, in every phrasing. The held-out requests' replies are prose around short code; a
drafter that learnt only the generator's kind guessed them far less well than its validation said
(docs/demo-training.md, "The shipped pair"), and a drafter guesses a task the target trained on far better than
a new one ("Acceptance by kind of task")."""

from __future__ import annotations

import random
import re

from . import everyday, everyday2, everyday3
from .prompts import EXTRA_TEMPLATES, FUNCTION_TEMPLATES, HELDOUT_NAMES, PromptGen, prompt_id, request_text

CALLED = re.compile(r"([A-Za-z_]\w*)\(")  # a name as a request writes it: NAME(
PROBE_TASKS = 64  # the last new tasks, held out of the drafter's requests to validate it on


def everyday_requests(seed: int, exclude: set[str]) -> list[str]:
    """Every everyday task in every function phrasing, less prompts whose id is in `exclude` (the training
    split's) or that hold a held-out name; distinct, in a seeded order."""
    return task_requests(everyday.tasks() + everyday2.tasks() + everyday3.tasks(), seed, exclude)


def novel_tasks(tasks: list[tuple[str, str, str]], trained_users: list[str]) -> list[tuple[str, str, str]]:
    """The (name, args, does) tasks whose name no trained request writes as NAME(: new to the target."""
    names = {m for u in trained_users for m in CALLED.findall(u)}
    return [t for t in tasks if t[0] not in names]


def split_probe(tasks: list) -> tuple[list, list]:
    """(the tasks to ask for, the last PROBE_TASKS of them, half at most, held out to validate on)."""
    k = min(PROBE_TASKS, len(tasks) // 2)
    return tasks[: len(tasks) - k], tasks[len(tasks) - k :]


def task_requests(tasks: list[tuple[str, str, str]], seed: int, exclude: set[str]) -> list[str]:
    """Each task in every function phrasing, less prompts whose id is in `exclude` or that hold a held-out
    name; distinct, in a seeded order."""
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


def draft_requests(n: int, seed: int, exclude: set[str], everyday_share: float, funcs=None,
                   novel: list[tuple[str, str, str]] = (), novel_share: float = 0.0) -> list[str]:
    """n distinct requests (fewer when the sources run dry): a share `everyday_share` of the held-out kind
    (everyday_requests), a share `novel_share` asking for the `novel` tasks (task_requests), the rest from
    PromptGen(seed, funcs=funcs), none in `exclude`, the kinds interleaved in a seeded order."""
    kind = task_requests(list(novel), seed, exclude)[: round(n * novel_share)]
    taken = set(exclude) | {prompt_id(u) for u in kind}
    kind += everyday_requests(seed, taken)[: round(n * everyday_share)]
    taken |= {prompt_id(u) for u in kind}
    rest = [p["user"] for p in PromptGen(seed, funcs=funcs).sample(n - len(kind), exclude=taken)]
    out = kind + rest
    random.Random(seed + 1).shuffle(out)
    return out
