"""End-to-end smoke of the one-shot CLI: the demo pair, a few prompts, every decoding mode, each mode in a
fresh process with a fresh user home (a first start, as a user meets it). At T=0 every mode must print the
same text as --mode ar; exits 1 (and says where) when one does not.

    python benchmarks/cli_smoke.py --device cuda [--max-new 64] [--kernels DIR]

--kernels: a user cache's `kernels` folder to copy into each fresh home (the CUDA library, built once).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

PROMPTS = ["Write a function that reverses a list", "def fibonacci(n):", "What is a closure?"]
MODES = [("ar", []), ("dflash", []), ("ddtree", ["--budget", "auto"]), ("ddtree", ["--budget", "16"])]


def one_shot(prompt: str, mode: str, extra: list[str], device: str, max_new: int, home: str) -> tuple[str, str]:
    env = dict(os.environ, DDTREE_CHAT_HOME=home)
    cmd = [sys.executable, "-m", "ddtree_chat.cli", "--prompt", prompt, "--mode", mode, *extra, "--device", device,
           "--temperature", "0", "--max-new-tokens", str(max_new)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"{mode} {extra} failed ({out.returncode}): {out.stderr.strip()[-500:]}")
    return out.stdout, out.stderr.strip().splitlines()[-1] if out.stderr.strip() else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--kernels", help="a built CUDA kernel library folder to seed each home with")
    a = ap.parse_args()
    bad = 0
    texts: dict[str, list[str]] = {}
    for mode, extra in MODES:
        name = " ".join([mode, *extra])
        with tempfile.TemporaryDirectory() as home:  # NOTE: one fresh home per mode, its first start included
            if a.kernels and os.path.isdir(a.kernels):
                shutil.copytree(a.kernels, os.path.join(home, "cache", "kernels"))
            t0 = time.perf_counter()
            texts[name] = []
            for p in PROMPTS:
                text, stats = one_shot(p, mode, extra, a.device, a.max_new, home)
                texts[name].append(text)
                print(f"{name:18s} {p[:30]!r:34s} {stats}")
            print(f"{name}: {time.perf_counter() - t0:.1f} s for {len(PROMPTS)} prompts")
    ref = texts["ar"]
    for name, got in texts.items():
        for p, g, r in zip(PROMPTS, got, ref):
            if g != r:
                bad += 1
                print(f"DIFFERS: {name} on {p!r}:\n  ar:   {r[:200]!r}\n  mode: {g[:200]!r}")
    print("identical text in every mode" if not bad else f"{bad} replies differ from ar")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
