"""Tensor parallelism across several GPUs, each rank on its own (NCCL, and the one-shot collectives where the GPUs
reach each other's memory): what test_tp_gpu.py proves with every rank on one GPU, on real ones. Each test skips
below the GPUs it needs (`bash benchmarks/gpu_session.sh multigpu` runs them on a multi-GPU machine)."""

import pytest
import torch

from ddtree_chat.engine import Engine, synthetic
from ddtree_chat.engine.parallel.oneshot_collectives import peer_access
from tp_checks import assert_a_dead_rank_ends_the_process_with_one_line, assert_modes_keep_ar, ids

pytestmark = pytest.mark.gpu
PROMPTS = ("tensor parallel", "def add(a, b):")
# the tiny pair with every split dimension divisible by 8 ranks (heads, the drafter's kv heads, intermediate
# sizes in whole INT4 groups of 32 per rank)
TP8 = dict(synthetic.PRESETS["tiny"], hidden=128, heads=8, q_lora=64, inter=256, moe_inter=256, draft_heads=8,
           draft_kv=8, draft_inter=256)
# the small pair (bf16: its experts fit the INT4 kernel's tiles whole) with a drafter that splits 8 ways
SMALL8 = dict(synthetic.PRESETS["small"], draft_kv=8)


def _gpus(n: int) -> None:
    if not torch.cuda.is_available() or torch.cuda.device_count() < n:
        pytest.skip(f"needs {n} CUDA GPUs")


@pytest.fixture
def own_gpus(monkeypatch):
    monkeypatch.delenv("DDTREE_TP_ONE_GPU", raising=False)  # NOTE: spawned workers inherit the environment


def _pair(tmp_path, monkeypatch, name: str, preset: dict):
    monkeypatch.setitem(synthetic.PRESETS, name, preset)
    return synthetic.make_synthetic_pair(tmp_path, preset=name, seed=0)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_tp_on_several_gpus_equals_one_gpu(tmp_path, monkeypatch, own_gpus, world):
    """float32: each rank on its own GPU, rounds recorded as graphs with the collectives inside, gives one GPU's
    logits and plain decoding's ids in every mode; the one-shot collectives are used exactly where peer access is."""
    _gpus(world)
    pair = _pair(tmp_path, monkeypatch, "tp8", TP8)
    single = Engine.load(*pair, device="cuda", graphs=False)
    engine = Engine.load(*pair, device="cuda", tp=world)
    try:
        assert engine.info["tp"] == world and engine.info["cuda_graphs"] > 0
        assert (engine.tp.oneshot is not None) == peer_access(world)
        for text in PROMPTS:
            prompt = single.tokenizer.encode(text)
            assert torch.allclose(engine.logits(prompt), single.logits(prompt), atol=1e-4, rtol=1e-4)
            want = ids(single, prompt, mode="ar", max_new_tokens=24)
            for mode, budget in (("ar", 0), ("ddtree", 16), ("dflash", 7), ("ddtree", "auto")):
                assert ids(engine, prompt, mode=mode, budget=budget, max_new_tokens=24) == want, (mode, budget)
    finally:
        engine.close()


@pytest.mark.parametrize("world,expert_parallel", [(2, False), (4, True), (8, True)])
def test_tp_on_several_gpus_is_exact_in_bf16(tmp_path, monkeypatch, own_gpus, world, expert_parallel):
    """bf16: the row-invariant kernels and the rank-ordered sums keep every speculative mode on plain decoding's ids
    with the ranks on their own GPUs (experts whole on a rank from 4 ranks: a split expert's slice would not fill
    the INT4 kernel's tiles)."""
    _gpus(world)
    pair = _pair(tmp_path, monkeypatch, "small8", SMALL8)
    engine = Engine.load(*pair, device="cuda", tp=world, dtype="bfloat16", expert_parallel=expert_parallel)
    try:
        assert engine.info["cuda_graphs"] > 0
        assert_modes_keep_ar(engine, PROMPTS, (("ddtree", 16), ("ddtree", 64), ("dflash", 7)), 48)
    finally:
        engine.close()


def test_a_dead_rank_on_its_own_gpu_ends_the_process_with_one_line(tmp_path, monkeypatch, own_gpus):
    """NCCL waits forever on a dead peer: rank 0's watchdog must end the process with one line naming the rank."""
    _gpus(2)
    assert_a_dead_rank_ends_the_process_with_one_line(*_pair(tmp_path, monkeypatch, "tp8", TP8), {})
