"""The self-instruct data set (issue 31): the teacher's proposed function requests parsed, filtered (held-out
names and tasks, taken names, malformed lines), kept resumably, phrased as prompts, and answered into a data set
the target trains on. The teacher is a stand-in here (the real GGUF run: docs/demo-training.md)."""

from __future__ import annotations

import json
import random

import pytest

from ddtree_chat.dev.demo import distil_data, self_instruct
from ddtree_chat.dev.demo.prompts import FUNCTION_TEMPLATES, HELDOUT, SIMPLE, request_text


@pytest.fixture(autouse=True)
def few_stdlib_names(monkeypatch):
    """taken_names() without parsing the whole standard library (~14 s): two stdlib names stand in."""
    fake = [type("F", (), {"name": n})() for n in ("dumps", "urlsplit")]
    monkeypatch.setattr(self_instruct, "stdlib_functions", lambda: fake)
    self_instruct.taken_names.cache_clear()
    yield
    self_instruct.taken_names.cache_clear()


def test_parse_takes_complete_request_lines_only():
    text = (" join_pairs(a, b) that returns the pairs of a and b joined by a dash.\n"
            "8. Write a Python function tidy_spaces(s) that collapses runs of spaces in s\n"
            "Some prose the teacher wrote.\n"
            "9. Write a function without_python(x) that is not in the form.\n"
            "10. Write a Python function cut_off(s) that returns")
    assert self_instruct.parse(text, finished=False) == [
        ("join_pairs", "a, b", "returns the pairs of a and b joined by a dash"),
        ("tidy_spaces", "s", "collapses runs of spaces in s")]
    # a finished continuation's last line is complete
    assert self_instruct.parse(" cut_off(s) that returns s cut at the first comma.", finished=True) == [
        ("cut_off", "s", "returns s cut at the first comma")]


@pytest.mark.parametrize("name,args,does,want", [
    ("shout_text", "s", "returns s in upper case with an exclamation mark", "ok"),
    ("check_word", "s", "returns True if the string s is a palindrome", "heldout"),  # a held-out task's word
    ("flip_words", "sentence", "reverses the order of the words in sentence", "heldout"),  # both words of a pair
    ("my_is_prime_helper", "n", "tells whether n can be split evenly", "heldout"),  # a held-out name inside
    ("primes_up_to", "n", "returns a list of small numbers below n", "heldout"),  # a word start in the name
    ("sum", "numbers", "returns the total of the numbers in a list", "taken"),  # a builtin
    ("dumps", "obj", "returns the object written as a JSON string", "taken"),  # a standard-library name
    (SIMPLE[0][0], SIMPLE[0][1], "returns something new about the list given", "taken"),  # an earlier set's name
    ("ShoutText", "s", "returns s in upper case with an exclamation mark", "name"),
    ("ab", "s", "returns s in upper case with an exclamation mark", "name"),
    ("shout_text", "s,", "returns s in upper case with an exclamation mark", "ok"),  # a trailing comma parses
    ("shout_text", "s t", "returns s in upper case with an exclamation mark", "args"),
    ("shout_text", "a, b, c, d, e", "returns a joined with the others by spaces", "args"),
    ("shout_text", "*parts", "returns the parts joined by spaces in upper case", "args"),
    ("shout_text", "s", "shouts s", "task"),  # too short
    ("shout_text", "s", "returns s shouted, like ```this```", "task"),
    ("shout_text", "s", "returns s in upper case — with a dash", "task"),  # not plain ASCII
])
def test_verdict(name, args, does, want):
    assert self_instruct.verdict(name, args, does, set(), set()) == want


def test_verdict_keeps_each_name_and_task_once():
    seen_names, seen_tasks = {"shout_text"}, {"returns s in upper case"}
    verdict = self_instruct.verdict
    assert verdict("shout_text", "s", "returns s made loud and clear", seen_names, seen_tasks) == "duplicate"
    assert verdict("loud_text", "s", "Returns  s in upper   case", seen_names, seen_tasks) == "duplicate"


def test_no_heldout_request_passes_the_filter():
    """Every held-out request, as its own name or under another, is left out."""
    for h in HELDOUT:
        assert self_instruct.verdict(h.name, h.args, h.does, set(), set()) == "heldout", h.name
        assert self_instruct.verdict("some_helper", h.args, h.does, set(), set()) == "heldout", h.does


def test_proposal_prompts_are_seeded_numbered_examples():
    pool = self_instruct.seed_tasks()
    a = self_instruct.proposal_prompt(random.Random(3), pool)
    assert a == self_instruct.proposal_prompt(random.Random(3), pool) != self_instruct.proposal_prompt(
        random.Random(4), pool)
    lines = a.splitlines()
    assert lines[0] == self_instruct.HEADER.strip()
    assert lines[-1] == f"{self_instruct.SHOTS + 1}. Write a Python function"
    examples = [self_instruct.LINE.match(x) for x in lines[2:-1]]
    assert len(examples) == self_instruct.SHOTS and all(examples)
    assert all((m.group(1), m.group(2), m.group(3)) in pool for m in examples)


def _write_proposals(out, rows):
    out.mkdir(parents=True, exist_ok=True)
    with open(out / self_instruct.PROPOSALS, "w") as f:
        for i, (name, status) in enumerate(rows):
            f.write(json.dumps({"name": name, "args": "s", "does": f"returns s changed in way {i}", "status": status,
                                "batch": 0}) + "\n")


def test_prompts_phrase_the_kept_proposals(tmp_path):
    _write_proposals(tmp_path, [(f"change_{i}", "ok") for i in range(40)] + [("dropped_one", "taken")])
    ps = self_instruct.prompts(tmp_path, 5)
    assert ps == self_instruct.prompts(tmp_path, 5)  # seeded
    names = {p["name"] for p in ps}
    assert names == {f"change_{i}" for i in range(40)} and all(p["kind"] == "function" for p in ps)
    users = {p["user"] for p in ps}
    # each in the held-out requests' phrasing, some a second time in another
    kept = self_instruct.kept_tasks(tmp_path)
    assert all(request_text(FUNCTION_TEMPLATES[0], n, a, d) in users for n, a, d in kept)
    assert 40 < len(ps) < 80
    assert len({p["id"] for p in ps}) == len(ps) and {p["source"] for p in ps} == {"self_instruct"}


class FakeTeacher:
    """The GGUF teacher's stand-in for the proposer: a fixed file identity and a character tokenizer."""

    def __init__(self, path=None, device="cpu", dtype=None):
        self.path, self.sha256, self.eos, self.model = type("P", (), {"name": "fake.gguf"})(), "ab" * 32, 2, None
        self.tok = type("Tok", (), {"encode": staticmethod(lambda t: type("E", (), {"ids": [ord(c) for c in t]})())})()

    def decode(self, ids):
        return "".join(map(chr, ids))


def fake_generate(model, prompts, max_new, temperature, top_p, seed, eos):
    """Each prompt's continuation: two requests named after the batch seed and the row, one held out, one cut."""
    rows = []
    for i, _ in enumerate(prompts):
        tag = f"{seed % 9973}_{i}"
        text = (f" shout_{tag}(s) that returns s in upper case, variant {tag}.\n"
                f"8. Write a Python function is_palindrome(s) that checks it.\n"
                f"9. Write a Python function quiet_{tag}(s) that returns s in lower case, variant {tag}.\n"
                f"10. Write a Python function cut")
        rows.append(([ord(c) for c in text], False))
    return rows


def test_main_keeps_proposals_resumably_and_refuses_another_seed(tmp_path, monkeypatch):
    import ddtree_chat.dev.demo.teacher as teacher

    monkeypatch.setattr(teacher, "Teacher", FakeTeacher)
    monkeypatch.setattr(teacher, "generate", fake_generate)
    out = tmp_path / "p"
    args = ["--out", str(out), "--batch", "3", "--seed", "5"]
    assert self_instruct.main(args + ["--tasks", "100", "--max-seconds", "0"]) == 0  # one batch, then the clock
    recs = distil_data.read_jsonl(out / self_instruct.PROPOSALS)
    assert [r["status"] for r in recs] == ["ok", "heldout", "ok"] * 3 and {r["batch"] for r in recs} == {0}
    assert self_instruct.main(args + ["--tasks", "10"]) == 0  # resumed: batch 1 onward, until 10 are kept
    recs = distil_data.read_jsonl(out / self_instruct.PROPOSALS)
    kept = self_instruct.kept_tasks(out)
    assert len(kept) == 12 and len({n for n, _, _ in kept}) == 12 and {r["batch"] for r in recs} == {0, 1}
    meta = json.loads((out / "meta.json").read_text())
    assert meta["teacher_sha256"] == "ab" * 32 and meta["seed"] == 5 and len(meta["runs"]) == 2 and meta["kept"] == 12
    with pytest.raises(SystemExit):
        self_instruct.main(["--out", str(out), "--seed", "6"])


def test_distil_data_answers_the_kept_proposals_into_a_training_set(tmp_path, monkeypatch):
    """distil_data --self-instruct DIR answers DIR's kept proposals into a data set of its own (its meta names the
    proposals' identity; a resume under another source is refused) that data.distil_sources trains on."""
    import ddtree_chat.dev.demo.teacher as teacher
    from ddtree_chat.dev.demo import data
    from test_demo_distil import FakeTeacher as AnsweringTeacher

    monkeypatch.setattr(teacher, "Teacher", AnsweringTeacher)
    proposals = tmp_path / "proposals"
    _write_proposals(proposals, [(f"change_{i}", "ok") for i in range(6)] + [("dropped_one", "name")])
    out = tmp_path / "self"
    args = ["--out", str(out), "--self-instruct", str(proposals), "--sampled", "0", "--seed", "5"]
    assert distil_data.main(args) == 0
    meta, kept = distil_data.load_dataset(out)
    assert meta["prompt_source"] == "self_instruct" and meta["tasks"] == 6
    assert meta["tasks_sha256"] == self_instruct.origin(proposals)["tasks_sha256"]
    answered = distil_data.read_jsonl(out / "answers.jsonl")
    assert len(answered) == meta["n_prompts"] >= 6 and kept and {r["kind"] for r in answered} == {"function"}
    first = distil_data.read_jsonl(out / "prompts.jsonl")
    # proposals kept since extend the list (the answered prompts unchanged) and a resume answers the new ones
    _write_proposals(proposals, [(f"change_{i}", "ok") for i in range(9)])
    assert distil_data.main(args) == 0
    meta, kept = distil_data.load_dataset(out)
    grown = distil_data.read_jsonl(out / "prompts.jsonl")
    assert grown[: len(first)] == first and len(grown) > len(first) and meta["tasks"] == 9
    answered = distil_data.read_jsonl(out / "answers.jsonl")
    assert len(answered) == meta["n_prompts"] == len(grown) and {r["id"] for r in answered} == {p["id"] for p in grown}
    # proposals that do not begin with the answered ones (another run's, as many as before) are refused
    _write_proposals(proposals, [(f"other_{i}", "ok") for i in range(9)])
    with pytest.raises(SystemExit):
        distil_data.main(args)
    for flags in (["--everyday"], []):
        with pytest.raises(SystemExit):
            distil_data.main(["--out", str(out), "--seed", "5", *flags])
    src = {"docs": {k: ["x = 1\n"] for k in ("train", "val", "test")}, "meta": {}}
    got = data.distil_sources(src, [out], 0.25, log=lambda *a: None)
    assert sum(len(v) for v in got["pairs"].values()) == len(kept)


def test_the_committed_set_is_its_proposals_answered_and_apart_from_the_others(tmp_path):
    """training/demo-distil-self.tar.xz: its prompts are what prompts() makes of its packed proposals, every kept
    proposal passes the filter again (held-out names and tasks above all), and no prompt, id or function name
    repeats one of the other committed sets'."""
    import tarfile

    from test_demo_distil import TRAINING, _assert_apart, _committed_prompts

    with tarfile.open(TRAINING / "demo-distil-self.tar.xz", "r:xz") as tf:
        tf.extractall(tmp_path, filter="data")
    meta, kept = distil_data.load_dataset(tmp_path / "self")
    ps = _committed_prompts("self")
    assert ps == self_instruct.prompts(tmp_path / "self-proposals", meta["seed"])
    assert meta["tasks_sha256"] == self_instruct.origin(tmp_path / "self-proposals")["tasks_sha256"] and kept
    tasks = self_instruct.kept_tasks(tmp_path / "self-proposals")
    seen: tuple[set, set] = (set(), set())
    for name, args, does in tasks:
        assert self_instruct.verdict(name, args, does, *seen) == "ok", (name, does)
        seen[0].add(name)
        seen[1].add(self_instruct.task_key(does))
    _assert_apart(ps, sum((_committed_prompts(n) for n in ("data", "everyday", "everyday2", "everyday3")), []))
