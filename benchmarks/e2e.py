"""End-to-end decoding speed, one process, same prompts: ar vs dflash vs ddtree (fixed budgets and auto).

    python benchmarks/e2e.py [--target DIR --draft DIR] [--device cpu|cuda] [--prompts N] [--max-new 128]
                             [--budgets 8 16 32 64 auto] [--eager] [--idle] [--json OUT] [--prompts-json FILE]
                             [--temperature 0.7 --top-p 0.95] [--history K]

Defaults to the shipped demo pair and its held-out prompts. Every mode's ids are checked against ar's in the
same run, at T > 0 too: prompt i is sampled with seed i in every mode, and each draw is keyed by its token's
position (engine/sampling.py), so a speculative mode samples exactly ar's tokens. --history K sends each request
as the last turn of a chat that holds the K requests before it and the target's own replies to them: the same
requests at chat-length contexts.
Prints one markdown table: mean accepted length (tokens per target forward),
tokens/s (whole reply, prefill included: every reply starts from a cache that shares no prefix with its
prompt, so each mode prefills the whole prompt) and decode tokens/s (after the first token: the rounds only),
speedup vs ar for each, and the round time split into drafter / target. On CUDA rounds run as CUDA
graphs unless --eager; --idle then profiles one reply per mode and reports the share of its wall time in
which no kernel ran, for the whole reply and for its decode window alone (the first token's event to the
end; the eager prefill excluded). With --repeat-penalty X every mode runs penalised, and one more row runs ar
without it, so the penalty's own cost is a ratio of the same run."""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

PLAIN = "plain"  # the extra run under --repeat-penalty: ar without the penalty


def _budget(text: str):
    return text if text == "auto" else int(text)


def covered(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of [lo, hi] covered by the union of the intervals (overlaps counted once)."""
    total, end = 0.0, lo
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def forget_prompt(eng, ids) -> None:
    """A one-token reply to a one-token prompt unlike `ids`: the next reply reuses none of the last one's
    cache (the engine keeps the longest common prefix, so a mode run after another on the same prompt
    would prefill one token only; before this, every drafting mode after dflash did)."""
    from ddtree_chat.engine import GenerationConfig

    for _ in eng.generate([(ids[0] + 1) % eng.tcfg.vocab_size], GenerationConfig(mode="ar", max_new_tokens=1)):
        pass


def with_history(eng, prompts: list[dict], k: int, max_new: int) -> list[dict]:
    """Each request as the last turn of a chat holding the k requests before it (cyclically) and the target's
    greedy replies to them (max_new tokens each, generated here, untimed)."""
    from ddtree_chat.engine import GenerationConfig

    tok, replies = eng.tokenizer, []
    for p in prompts:
        *_, last = eng.generate(p["prompt_ids"], GenerationConfig(mode="ar", max_new_tokens=max_new))
        replies.append(tok.decode(last["token_ids"], skip_special=True))
    out = []
    for i, p in enumerate(prompts):
        turns = []
        for j in range(i - k, i):
            turns += [{"role": "user", "content": prompts[j % len(prompts)]["user"]},
                      {"role": "assistant", "content": replies[j % len(prompts)]}]
        out.append({"user": p["user"], "prompt_ids": tok.render_chat(turns + [{"role": "user", "content": p["user"]}])})
    return out


def gpu_idle(eng, ids, cfg) -> tuple[float, float]:
    """One reply under the profiler: the share of the whole reply's window, and of its decode window (first
    token's event to the end), in which no kernel or copy ran (the union of their spans, so overlaps do not
    count twice)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    forget_prompt(eng, ids)
    torch.cuda.synchronize()
    mark = record_function("decode")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("reply"):
            for ev in eng.generate(ids, cfg):
                if ev.get("prefill"):
                    mark.__enter__()
            torch.cuda.synchronize()
            mark.__exit__(None, None, None)
    events = prof.events()
    kernels = [(e.time_range.start, e.time_range.end) for e in events if e.device_type == DeviceType.CUDA]

    def idle(name: str) -> float:
        w = next(e.time_range for e in events if e.name == name)
        return 1.0 - covered(kernels, w.start, w.end) / (w.end - w.start) if w.end > w.start else 0.0

    return idle("reply"), idle("decode")


def main(argv=None) -> int:
    from ddtree_chat.dev.demo.common import heldout_prompts
    from ddtree_chat.engine import Engine, GenerationConfig
    from ddtree_chat.engine.default_model import resolve_model_dirs

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--device", default=None)
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--budgets", type=_budget, nargs="+", default=[8, 16, 32, 64, "auto"])
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--repeat-penalty", type=float, default=1.0, help="the chat's --repeat-penalty (1: off)")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default=None, help="default: bf16 on GPU, fp32 on CPU")
    ap.add_argument("--threads", type=int, default=None, help="CPU intra-op threads (default: the engine's choice)")
    ap.add_argument("--eager", action="store_true", help="no CUDA graphs")
    ap.add_argument("--idle", action="store_true", help="profile GPU idle time per mode (CUDA)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--prompts-json", type=Path, default=None,
                    help="a list of {user, prompt_ids} (default: the shipped heldout_prompts.json); a retrained "
                         "pair's own, e.g. requests + test of its training run's heldout.json")
    ap.add_argument("--history", type=int, default=0,
                    help="each request after the K before it and the target's replies to them, in one chat")
    a = ap.parse_args(argv)
    target, draft = resolve_model_dirs(a.target, a.draft)  # as the CLI: --draft alone keeps the default target
    t_load = time.perf_counter()
    eng = Engine.load(target, draft, device=a.device, dtype=getattr(torch, a.dtype) if a.dtype else None,
                      graphs=not a.eager)
    t_load = time.perf_counter() - t_load
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.prompts_json is None:
        prompts = heldout_prompts(a.prompts)
    else:  # ids from the retrained pair's own tokenizer (the shipped file's are the shipped tokenizer's)
        prompts = [x for x in json.loads(a.prompts_json.read_text()) if len(x["user"]) <= 600][: a.prompts]
    if a.history:
        prompts = with_history(eng, prompts, a.history, a.max_new)
    runs = [("ar", 0), ("dflash", eng.dcfg.block_size - 1)] + [("ddtree", b) for b in a.budgets]
    if a.repeat_penalty != 1:  # NOTE: plain ar beside the penalised modes: the penalty's own cost, side by side
        runs.append(("ar", PLAIN))

    def settings(b) -> dict:  # a run's budget and penalty (PLAIN: ar without the penalty)
        return {"budget": 0, "repeat_penalty": 1.0} if b == PLAIN else {"budget": b, "repeat_penalty": a.repeat_penalty}

    print(f"loaded in {t_load:.1f} s", file=sys.stderr, flush=True)  # NOTE: progress, for runs under a time limit
    # NOTE: on a GPU every reply once: the programs of each cache span a timed reply reaches are recorded here
    cuda = eng.device.type == "cuda"
    for mode, b in runs:  # warm-up: allocations, kernel builds, the auto budget's cost curve, the programs
        t0 = time.perf_counter()  # NOTE: of this run's settings (a penalised round's are recorded on first use)
        cfg = GenerationConfig(mode=mode, max_new_tokens=a.max_new if cuda else 16, temperature=a.temperature,
                               top_p=a.top_p, **settings(b))
        for p in prompts if cuda else prompts[:1]:
            for _ in eng.generate(p["prompt_ids"], cfg):
                pass
        print(f"warm-up {mode} {b}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    recorded_before = eng.info["graph_capture_s"]
    res = {f"{m}-{b}": {"tokens": 0, "forwards": 0, "seconds": 0.0, "decode_s": 0.0, "draft_s": 0.0, "target_s": 0.0,
                        "mismatch": 0, "budgets": {}} for m, b in runs}
    ar_ids = []
    for i, p in enumerate(prompts):
        for mode, b in runs:
            cfg = GenerationConfig(mode=mode, max_new_tokens=a.max_new, temperature=a.temperature, top_p=a.top_p,
                                   seed=i, **settings(b))
            r = res[f"{mode}-{b}"]
            forget_prompt(eng, p["prompt_ids"])
            if eng.device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for ev in eng.generate(p["prompt_ids"], cfg):
                if ev.get("prefill"):
                    t_first = time.perf_counter()  # NOTE: the first token's event: prefill done
                elif ev["event"] == "round" and b == "auto":
                    r["budgets"][ev["budget"]] = r["budgets"].get(ev["budget"], 0) + 1
            if eng.device.type == "cuda":
                torch.cuda.synchronize()
            r["seconds"] += time.perf_counter() - t0
            r["decode_s"] += time.perf_counter() - t_first
            r["tokens"] += len(ev["token_ids"])
            r["forwards"] += ev["target_forwards"]
            r["draft_s"] += ev["draft_s"]
            r["target_s"] += ev["target_s"]
            if (mode, b) == ("ar", 0):
                ar_ids.append(ev["token_ids"])
            elif ev["token_ids"] != ar_ids[i] and b != PLAIN:
                r["mismatch"] += 1
        print(f"prompt {i + 1}/{len(prompts)} done", file=sys.stderr, flush=True)
    recorded_timed = eng.info["graph_capture_s"] - recorded_before  # recording inside the timed replies
    if a.idle and eng.device.type == "cuda":
        for mode, b in runs:
            res[f"{mode}-{b}"]["gpu_idle"], res[f"{mode}-{b}"]["decode_idle"] = gpu_idle(eng, prompts[0]["prompt_ids"],
                                                      GenerationConfig(mode=mode, max_new_tokens=a.max_new,
                                                                       **settings(b)))
    ar_tps = res["ar-0"]["tokens"] / res["ar-0"]["seconds"]
    ar_decode = (res["ar-0"]["tokens"] - len(prompts)) / res["ar-0"]["decode_s"]
    idle = any("gpu_idle" in r for r in res.values())
    lines = ["| mode | budget | mean accepted length | tokens/s | speedup vs ar | decode tokens/s | decode speedup "
             "| first token ms | draft / target s | ids == ar |" + (" GPU idle (reply / decode) |" if idle else ""),
             "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if idle else "")]
    for mode, b in runs:
        r = res[f"{mode}-{b}"]
        r["mean_accepted_length"] = r["tokens"] / r["forwards"]
        r["tokens_per_second"] = r["tokens"] / r["seconds"]
        r["speedup"] = r["tokens_per_second"] / ar_tps
        r["decode_tokens_per_second"] = (r["tokens"] - len(prompts)) / r["decode_s"]  # the first token is prefill's
        r["decode_speedup"] = r["decode_tokens_per_second"] / ar_decode
        # NOTE: per prompt, the reply's start to its first token (prefill, eager: the host's speed shows here)
        r["first_token_ms"] = 1e3 * (r["seconds"] - r["decode_s"]) / len(prompts)
        shown = b if mode != "ar" else "no penalty" if b == PLAIN else "-"
        if b == "auto" and r["budgets"]:
            shown = "auto (" + ", ".join(f"{k}:{v}" for k, v in sorted(r["budgets"].items())) + ")"
        lines.append(f"| {mode} | {shown} | {r['mean_accepted_length']:.2f} | {r['tokens_per_second']:.1f} | "
                     f"{r['speedup']:.2f}x | {r['decode_tokens_per_second']:.1f} | {r['decode_speedup']:.2f}x | "
                     f"{r['first_token_ms']:.1f} | {r['draft_s']:.2f} / {r['target_s']:.2f} | "
                     f"{'n/a (no penalty)' if b == PLAIN else 'yes' if r['mismatch'] == 0 else 'NO (%d)' % r['mismatch']} |"
                     + (f" {100 * r['gpu_idle']:.0f}% / {100 * r['decode_idle']:.0f}% |" if idle else ""))
    where = torch.cuda.get_device_name() if eng.device.type == "cuda" else \
        f"CPU float32, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}"
    info = eng.info
    lens = [len(p["prompt_ids"]) for p in prompts]
    print(f"{len(prompts)} held-out prompts ({min(lens)}-{max(lens)} tokens, {a.history} earlier turns each), "
          f"max_new_tokens {a.max_new}, T={a.temperature:g}, top-p {a.top_p:g}, "
          f"repeat penalty {a.repeat_penalty:g}, "
          f"{where}, {eng.decoder.dtype}, "
          f"CUDA graphs: {info['cuda_graphs']} recorded in {info['graph_capture_s']:.2f} s, {recorded_timed:.2f} s of it "
          f"inside timed replies (load {t_load:.1f} s)")
    print("\n".join(lines))
    if a.json:
        a.json.write_text(json.dumps({"prompts": len(prompts), "max_new": a.max_new, "device": where,
                                      "temperature": a.temperature, "top_p": a.top_p,
                                      "repeat_penalty": a.repeat_penalty, "history": a.history, "prompt_tokens": lens,
                                      "results": res}, indent=1, default=str))
    return 0 if all(r["mismatch"] == 0 for r in res.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
