"""Measure the TUI's cost on generation speed: the same replies with and without the app.

    python benchmarks/ui_overhead.py [--model DIR --draft DIR] [--tokens 256] [--reps 5]

One engine is loaded once; bare `engine.generate` runs and runs through the (headless) chat
app alternate, so both see the same machine state. Prints one table and a JSON line.
Headless means Textual composes and renders every update but writes no terminal bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time


def bare(engine, ids, cfg) -> float:
    done = None
    for ev in engine.generate(ids, cfg):
        done = ev
    return float(done["tokens_per_second"]), len(done["token_ids"])


async def through_app(engine, settings, prompt: str, reps: int) -> list[tuple[float, int]]:
    from ddtree_chat.ui.app import DDTreeChatApp
    from ddtree_chat.ui.chat_view import ChatInput

    out = []
    app = DDTreeChatApp(lambda progress: engine, settings)
    if os.environ.get("BENCH_UI_SHARE"):
        from ddtree_chat.ui import generation

        generation.UI_SHARE = float(os.environ["BENCH_UI_SHARE"])
    if os.environ.get("BENCH_INTERVAL"):
        app.update_interval = float(os.environ["BENCH_INTERVAL"])
    async with app.run_test(size=(120, 40)) as pilot:
        while app.engine is None:
            await pilot.pause(0.01)
        for _ in range(reps):
            app.new_chat()  # identical prompt every time
            before = len(app.session.messages)
            app.query_one(ChatInput).text = prompt
            await pilot.press("enter")
            while len(app.session.messages) < before + 2 or app.generating:
                await asyncio.sleep(0.1)  # NOTE: not pilot.pause, which makes the app do extra work
            meta = app.session.messages[-1].meta
            out.append((float(meta["tokens_per_second"]), int(meta["tokens"])))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--draft")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--mode", default="ddtree")
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--prompt", default="count")
    a = ap.parse_args(argv)
    os.environ.setdefault("DDTREE_CHAT_HOME", tempfile.mkdtemp(prefix="ddtree-bench-"))

    from ddtree_chat.engine import Engine, GenerationConfig
    from ddtree_chat.settings import Settings

    if a.model:
        target, draft = a.model, a.draft
    else:
        from ddtree_chat.engine.synthetic import make_synthetic_pair

        target, draft = make_synthetic_pair(os.path.join(tempfile.gettempdir(), "ddtree-bench-pair"), preset="tiny", seed=0)
    engine = Engine.load(target, draft_dir=draft, device=a.device)
    settings = Settings(mode=a.mode, budget=a.budget, max_new_tokens=a.tokens, thinking=False)
    cfg = GenerationConfig(mode=a.mode, budget=a.budget, max_new_tokens=a.tokens)
    ids = engine.tokenizer.render_chat([{"role": "user", "content": a.prompt}], add_generation_prompt=True, thinking=False)
    bare(engine, ids, cfg)  # warm-up: first-call allocations and thread pools
    plain, tui = [], []
    for _ in range(a.reps):
        plain.append(bare(engine, ids, cfg))
        tui += asyncio.run(through_app(engine, settings, a.prompt, 1))
    p = statistics.median(x for x, _ in plain)
    t = statistics.median(x for x, _ in tui)
    print(f"{'':10} {'tok/s (median)':>15} {'tokens/reply':>13}  runs")
    print(f"{'engine':10} {p:15.1f} {plain[0][1]:13d}  {', '.join(f'{x:.1f}' for x, _ in plain)}")
    print(f"{'TUI':10} {t:15.1f} {tui[0][1]:13d}  {', '.join(f'{x:.1f}' for x, _ in tui)}")
    print(f"TUI overhead: {100 * (1 - t / p):.1f}% ({engine.info.get('device')}, mode {a.mode}, budget {a.budget})")
    print(json.dumps({"engine_tps": p, "tui_tps": t, "overhead": 1 - t / p, "reps": a.reps, "tokens": a.tokens,
                      "mode": a.mode, "budget": a.budget, "device": engine.info.get("device"), "time": time.time()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
