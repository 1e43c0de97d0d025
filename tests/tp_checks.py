"""Checks the tensor-parallel GPU tests share (tests/test_tp_gpu.py: every rank on one GPU; tests/test_multigpu.py:
each rank on its own)."""

import os
import subprocess
import sys
import textwrap

from ddtree_chat.engine import GenerationConfig


def ids(engine, prompt, **kw) -> list[int]:
    return list(engine.generate(prompt, GenerationConfig(stop_token_ids=(), **kw)))[-1]["token_ids"]


def assert_modes_keep_ar(engine, prompts, modes, max_new: int) -> None:
    """Each speculative (mode, budget) gives the engine's own ar ids on every prompt."""
    for text in prompts:
        prompt = engine.tokenizer.encode(text)
        want = ids(engine, prompt, mode="ar", max_new_tokens=max_new)
        for mode, budget in modes:
            assert ids(engine, prompt, mode=mode, budget=budget, max_new_tokens=max_new) == want, (mode, budget)


def assert_a_dead_rank_ends_the_process_with_one_line(target, draft, env: dict) -> None:
    """A TP=2 engine whose rank 1 is killed mid-reply: the process ends nonzero with one `ddtree-chat:` line
    naming rank 1 (as the CLI reports it), no traceback, no hang."""
    script = textwrap.dedent(f"""
        import os, signal, sys
        from ddtree_chat.engine import Engine, GenerationConfig
        from ddtree_chat.engine.errors import EngineError
        engine = Engine.load({str(target)!r}, {str(draft)!r}, device="cuda", tp=2)
        gen = engine.generate(engine.tokenizer.encode("x"), GenerationConfig(max_new_tokens=100000, stop_token_ids=()))
        next(gen)
        os.kill(engine.workers.procs[0].pid, signal.SIGKILL)
        try:  # NOTE: the host group's broadcast fails at once, or rank 0's watchdog ends the process first
            for _ in gen:
                pass
        except EngineError as e:
            print(f"ddtree-chat: {{e}}", file=sys.stderr)  # as the CLI reports it
            sys.exit(1)
        print("NOT REACHED")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240,
                         env=dict(os.environ, **env) if env else None)
    assert out.returncode != 0 and "NOT REACHED" not in out.stdout
    said = [line for line in out.stderr.splitlines() if line.startswith("ddtree-chat:")]
    assert said and all("rank 1" in line for line in said) and "Traceback" not in out.stderr, out.stderr[-2000:]
