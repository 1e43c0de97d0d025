"""Name-swap copies of the teacher's function answers: the same request and answer with the requested
function called something else, in the prompt's signature and in the answer's code.

Why: trained on each answer under its one stdlib name, the small target learnt which names go with which
requests and answered held-out requests with a memorised name (`def contains_digit` for "is_palindrome"):
0/20 defined the requested function. A name that changes while the answer stays the same can only be
taken from the prompt, so these copies teach the model to copy it.

Where the new names' words come from (`pool`): "names", the words of the requested stdlib names (the model
learnt that pool's odd words and emitted them: `def isabs_pmakeraw` for is_palindrome); "prose", the lowercase
English words of the requests' descriptions (held-out names are made of such words); "syllables", made-up words of 2-3
consonant-vowel syllables, which no pool statistics can predict: only a copy gets them right; "mixed", each word a
prose word or a made-up one at even odds (everyday words next to pieces only a copy gets right: the prose-trained
target missed every held-out name with a rare word, `palindrome`, `factorial`)."""

from __future__ import annotations

import builtins
import functools
import keyword
import multiprocessing
import os
import random
import re

from .prompts import HELDOUT_NAMES, defines, python_code

WORD = re.compile(r"^[a-z]{2,12}$")
PROSE = re.compile(r"\b[a-z]{3,10}\b")
POOLS = ("names", "prose", "syllables", "mixed")
DEFAULT_POOL = "mixed"  # held out 9/20 defined vs prose 4/20 (docs/demo-training.md, the fourth GPU run)
CONSONANTS, VOWELS = "bdfgklmnprstvz", "aeiou"


def word_pool(names: list[str]) -> list[str]:
    """The words of the requested names (`quote_plus` -> quote, plus), sorted, duplicates dropped."""
    return sorted({w for n in names for w in n.split("_") if WORD.match(w)})


def prose_pool(requests: list[str]) -> list[str]:
    """The lowercase words of 3-10 letters in these function requests after their signature (the description:
    English, not code), sorted, duplicates dropped."""
    return sorted({w for u in requests for w in PROSE.findall(u.split(")", 1)[-1])})


def syllable_word(rng: random.Random) -> str:
    """A made-up word of 2-3 consonant-vowel syllables (`tamiro`)."""
    return "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(rng.choice((2, 3))))


def fresh_name(rng: random.Random, word, *avoid: set[str], tries: int = 100) -> str | None:
    """1-3 words of word(rng) joined by `_`, none of: a keyword, a builtin, a held-out name, a name in an avoid
    set (None when `tries` draws found none: a tiny pool)."""
    for _ in range(tries):
        name = "_".join(word(rng) for _ in range(rng.choice((1, 2, 2, 3))))
        if not (keyword.iskeyword(name) or hasattr(builtins, name) or name in HELDOUT_NAMES
                or any(name in a for a in avoid)):
            return name
    return None


def renamable(name: str | None) -> bool:
    """Names whose uses can be found by the patterns below: no builtins (their calls would be renamed too)."""
    return bool(name) and len(name) >= 3 and name.isidentifier() and not hasattr(builtins, name)


def swap(user: str, answer: str, old: str, new: str) -> tuple[str, str] | None:
    """(user, answer) with old -> new where it names the function: `old(` not after a dot or a word
    character, and `` `old` ``; None when the result no longer asks for and defines new."""
    call = re.compile(rf"(?<![\w.]){re.escape(old)}(?=\s*\()")
    quoted = f"`{old}`"
    u = call.sub(new, user, count=1)
    a = call.sub(new, answer).replace(quoted, f"`{new}`")
    if f"{new}(" not in u or not defines(python_code(a), new):
        return None
    return u, a


def rename_copies(pairs: list[tuple[str, str, str]], names: dict[str, str], copies: int, seed: int,
                  pool: str = DEFAULT_POOL, workers: int | None = None, chunk: int = 2000):
    """For each (id, user, answer) whose prompt asked for a function names[id]: up to `copies` name-swapped
    copies under distinct new names drawn from `pool` (POOLS), ids suffixed `~k`. Deterministic in (seed, id, k),
    so the same from any number of worker processes (default: one per CPU core), each given `chunk` pairs at a time."""
    if copies <= 0:
        return []
    if pool not in POOLS:
        raise ValueError(f"rename pool {pool!r}: one of {', '.join(POOLS)}")
    words = (word_pool([n for n in names.values() if n]) if pool == "names"
             else prose_pool([u for pid, u, _ in pairs if names.get(pid)]))
    todo = [(pid, user, answer, names[pid]) for pid, user, answer in pairs if renamable(names.get(pid))]
    parts = [todo[i : i + chunk] for i in range(0, len(todo), chunk)]
    work = functools.partial(_copies, copies=copies, seed=seed, pool=pool, words=words, avoid=set(names.values()))
    workers = min(len(parts), workers or os.cpu_count() or 1)
    if workers > 1:  # the ast parse of every copy (swap's check) is most of the data stage's reading time
        with multiprocessing.Pool(workers) as p:
            done = p.map(work, parts)
    else:
        done = map(work, parts)
    return [c for part in done for c in part]


def _copies(todo: list[tuple[str, str, str, str]], copies: int, seed: int, pool: str, words: list[str],
            avoid: set[str]) -> list[tuple[str, str, str]]:
    """rename_copies' copies of (id, user, answer, requested name) rows."""
    def word(rng: random.Random) -> str:
        made_up = pool == "syllables" or (pool == "mixed" and rng.random() < 0.5)
        return syllable_word(rng) if made_up else rng.choice(words)

    out = []
    for pid, user, answer, old in todo:
        used = set()
        for k in range(copies):
            new = fresh_name(random.Random(f"{seed}:{pid}:{k}"), word, avoid, used)
            got = None if new is None else swap(user, answer, old, new)
            if got is not None:
                used.add(new)
                out.append((f"{pid}~{k}", *got))
    return out
