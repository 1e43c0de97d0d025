"""Tensor parallelism on CPU (gloo, local worker processes): same logits and ids as TP=1, expert-parallel
== intermediate split, clear errors when a rank dies or cannot load, memory planning for K2.6."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from ddtree_chat.engine import Engine, GenerationConfig
from ddtree_chat.engine.errors import DeviceError, EngineError
from ddtree_chat.engine.memory import check_host_memory, plan_memory, weight_bytes
from ddtree_chat.engine.random_model import k26_config

PROMPT = "tensor parallel"


@pytest.fixture(scope="module")
def single(synthetic_pair):
    return Engine.load(*synthetic_pair, device="cpu")


def _ids(engine, prompt, **kw):
    return list(engine.generate(prompt, GenerationConfig(stop_token_ids=(), **kw)))[-1]["token_ids"]


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_tp2_matches_tp1(synthetic_pair, single, expert_parallel):
    prompt = single.tokenizer.encode(PROMPT)
    engine = Engine.load(*synthetic_pair, device="cpu", tp=2, expert_parallel=expert_parallel)
    try:
        assert engine.info["tp"] == 2
        # the drafter is split too: half the heads and of fc's input features on each rank
        assert engine.drafter.kv_heads * 2 == single.drafter.kv_heads
        assert engine.drafter.fc.weight.shape[1] * 2 == single.drafter.fc.weight.shape[1]
        assert torch.allclose(engine.logits(prompt), single.logits(prompt), atol=1e-4, rtol=1e-4)
        for mode, budget in (("ddtree", 16), ("dflash", 7), ("ar", 0)):
            assert _ids(engine, prompt, mode=mode, budget=budget, max_new_tokens=24) == \
                _ids(single, prompt, mode=mode, budget=budget, max_new_tokens=24)
        # every rank penalises from its own copy of the committed tokens, in step
        assert _ids(engine, prompt, mode="ddtree", budget=16, max_new_tokens=24, repeat_penalty=1.5) == \
            _ids(single, prompt, mode="ar", max_new_tokens=24, repeat_penalty=1.5)
        gen = engine.generate(prompt, GenerationConfig(mode="ddtree", max_new_tokens=50, stop_token_ids=()))
        next(gen), next(gen)
        gen.close()  # stopping mid-reply keeps every rank in step
        assert _ids(engine, prompt, mode="ar", max_new_tokens=8) == _ids(single, prompt, mode="ar", max_new_tokens=8)
    finally:
        engine.close()


def test_killed_worker_is_reported_quickly(synthetic_pair):
    engine = Engine.load(*synthetic_pair, device="cpu", tp=2)
    prompt = engine.tokenizer.encode(PROMPT)
    try:
        gen = engine.generate(prompt, GenerationConfig(mode="ddtree", max_new_tokens=400, stop_token_ids=()))
        next(gen)
        os.kill(engine.workers.procs[0].pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(EngineError, match="rank 1"):
            for _ in gen:
                pass
        assert time.monotonic() - t0 < 10
        with pytest.raises(EngineError, match="rank 1"):
            engine.logits(prompt)  # the engine stays in its error state, no hang
    finally:
        engine.close()


def test_load_failure_under_tp_is_clear(synthetic_pair, tmp_path):
    import shutil

    target, draft = synthetic_pair
    bad = tmp_path / "target"
    shutil.copytree(target, bad)
    index = json.loads((bad / "model.safetensors.index.json").read_text())
    (bad / sorted(set(index["weight_map"].values()))[0]).write_bytes(b"garbage")
    t0 = time.monotonic()
    with pytest.raises(EngineError, match="truncated or corrupt"):
        Engine.load(bad, draft, device="cpu", tp=2)
    assert time.monotonic() - t0 < 60


def test_cli_runs_with_tp2(synthetic_pair):
    target, draft = synthetic_pair
    r = subprocess.run([sys.executable, "-m", "ddtree_chat.cli", "--model", str(target), "--draft", str(draft),
                        "--tp", "2", "--device", "cpu", "--prompt", "hi", "--json", "--max-new-tokens", "8"],
                       capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["event"] == "done"


def test_memory_plan_for_k26():
    cfg = k26_config()
    gib = 1024**3
    eight = plan_memory(cfg, 8, 96 * gib, 65536)
    assert eight.fits
    assert 70 * gib < eight.weights_per_rank < 76 * gib  # ~595 GB / 8
    assert 590e9 < plan_memory(cfg, 1, 96 * gib, 1).weights_per_rank < 600e9
    with pytest.raises(DeviceError, match=r"--tp 4 .* at least 7 GPUs"):
        plan_memory(cfg, 4, 96 * gib, 4096).check()


def test_host_memory_check_for_a_cpu_load(synthetic_pair, monkeypatch):
    """A CPU load holds the dequantised experts of every rank in one host: K2.6 on a 23 GiB machine is one
    clear error (not the kernel's out-of-memory kill), and Engine.load checks before reading any weight."""
    import ddtree_chat.engine.engine as engine_module

    cfg, gib = k26_config(), 1024**3
    assert weight_bytes(cfg, elem=2, packed=False) > 3 * weight_bytes(cfg)  # bf16 experts: 3.6x their INT4 + scales
    with pytest.raises(DeviceError, match=r"needs ~\d+ GiB of host memory on the CPU .*16-bit.* but 23 GiB are"):
        check_host_memory(cfg, 1, 2, 23 * gib)
    check_host_memory(cfg, 8, 2, 3 * 1024 * gib)  # ~2 TB of bf16 weights in 3 TiB
    check_host_memory(cfg, 1, 2, None)  # unknown: no check
    loads = []
    monkeypatch.setattr(engine_module, "host_available", lambda: 1 << 20)
    monkeypatch.setattr(Engine, "_load_rank", classmethod(lambda cls, **kw: loads.append(kw)))
    with pytest.raises(DeviceError, match="32-bit values"):  # the CPU's default dtype for this pair: float32
        Engine.load(*synthetic_pair, device="cpu")
    assert not loads


def test_interrupted_generation_still_shuts_down(synthetic_pair):
    engine = Engine.load(*synthetic_pair, device="cpu", tp=2)
    gen = engine.generate(engine.tokenizer.encode(PROMPT), GenerationConfig(mode="ddtree", max_new_tokens=400,
                                                                           stop_token_ids=()))
    next(gen)
    with pytest.raises(KeyboardInterrupt):
        gen.throw(KeyboardInterrupt)  # Ctrl+C while the ranks are mid-reply
    procs = list(engine.workers.procs)
    t0 = time.monotonic()
    engine.close()
    assert time.monotonic() - t0 < 10 and not any(p.is_alive() for p in procs)


def test_watchdog_reports_a_dead_rank(synthetic_pair):
    """The GPU path (NCCL would block forever on a dead peer) relies on this watchdog; exercised with gloo."""
    import threading

    engine = Engine.load(*synthetic_pair, device="cpu", tp=2)
    seen, fired = [], threading.Event()
    try:
        engine.workers.watch(lambda err: (seen.append(err), fired.set()))
        os.kill(engine.workers.procs[0].pid, signal.SIGKILL)
        assert fired.wait(5) and "rank 1" in str(seen[0])
    finally:
        engine.close()
