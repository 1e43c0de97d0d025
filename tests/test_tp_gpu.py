"""Tensor parallelism on the GPU, proven on one GPU with real processes (DDTREE_TP_ONE_GPU=1: every rank on
GPU 0, the one-shot collectives through CUDA IPC; NCCL refuses two ranks on one GPU). Speed means nothing
here (ranks time-slice the GPU); correctness is the point: the one-shot sums are bit-equal on every rank,
TP=2 equals TP=1, speculative ids equal plain decoding (bf16 too), graphs equal direct runs, a dead rank
ends the process with one line."""

import subprocess
import sys
import textwrap

import pytest
import torch

from ddtree_chat.engine import Engine
from ddtree_chat.engine.ops.triton_exchange import exchange_ref
from tp_checks import assert_a_dead_rank_ends_the_process_with_one_line, assert_modes_keep_ar, ids

pytestmark = pytest.mark.gpu
PROMPTS = ("tensor parallel", "def add(a, b):")


def _partial(rank: int, n: int, dtype, step: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + 10 * rank + n % 7)
    return torch.randn(n, generator=g).to(dtype)


def _oneshot_rank(rank, world, port, results):
    """One rank: eager collectives at several sizes (one that needs pieces), then a recorded graph replayed
    on new inputs; each result compared with the twin over every rank's partial."""
    import torch.distributed as dist

    from ddtree_chat.engine.parallel.oneshot_collectives import OneShot

    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        dev = torch.device("cuda", 0)
        one = OneShot(rank, world, dev, None, half_bytes=65536)
        for n, dtype in ((7168, torch.bfloat16), (17 * 7168, torch.bfloat16), (70000, torch.float32), (5, torch.float32)):
            parts = [_partial(r, n, dtype) for r in range(world)]
            got = one.all_reduce(parts[rank].to(dev)).cpu()
            assert torch.equal(got, exchange_ref(parts, gather=False)), f"all_reduce n={n} {dtype}"
            gathered = one.all_gather_last(parts[rank].view(1, -1).to(dev)).cpu()
            assert torch.equal(gathered, torch.cat(parts)[None]), f"all_gather n={n} {dtype}"
        static = torch.zeros(3 * 7168, dtype=torch.bfloat16, device=dev)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            one.all_reduce(static)  # NOTE: warm-up (compiles) outside the capture, as the engine records
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = one.all_reduce(static)
        for step in range(1, 4):
            parts = [_partial(r, static.numel(), torch.bfloat16, step) for r in range(world)]
            static.copy_(parts[rank])
            graph.replay()
            assert torch.equal(out.cpu(), exchange_ref(parts, gather=False)), f"replay {step}"
        torch.cuda.synchronize()
        dist.barrier()
        results.put((rank, "ok"))
    except BaseException as e:  # noqa: BLE001 - reported to the test
        results.put((rank, f"{type(e).__name__}: {e}"))


@pytest.mark.parametrize("world", [2, 4])
def test_oneshot_collectives_sum_in_rank_order_on_every_rank(world):
    import torch.multiprocessing as mp

    from ddtree_chat.engine.parallel.workers import _free_port

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_oneshot_rank, args=(r, world, port, results)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        got = dict(results.get(timeout=300) for _ in range(world))
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert got == {r: "ok" for r in range(world)}


@pytest.fixture
def one_gpu(monkeypatch):
    monkeypatch.setenv("DDTREE_TP_ONE_GPU", "1")  # NOTE: spawned workers inherit it


def test_tp2_on_one_gpu_equals_tp1_in_graphs_and_directly(synthetic_pair, one_gpu):
    single = Engine.load(*synthetic_pair, device="cuda", graphs=False)
    runs = {}
    for graphs in (True, False):
        engine = Engine.load(*synthetic_pair, device="cuda", tp=2, graphs=graphs)
        try:
            assert engine.info["tp"] == 2 and (engine.info["cuda_graphs"] > 0) == graphs
            assert engine.tp.oneshot is not None
            for text in PROMPTS:
                prompt = single.tokenizer.encode(text)
                if graphs:
                    assert torch.allclose(engine.logits(prompt), single.logits(prompt), atol=1e-4, rtol=1e-4)
                for mode, budget in (("ar", 0), ("ddtree", 16), ("dflash", 7), ("ddtree", "auto")):
                    runs[graphs, text, mode, budget] = ids(engine, prompt, mode=mode, budget=budget, max_new_tokens=24)
        finally:
            engine.close()
    for text in PROMPTS:
        want = ids(single, single.tokenizer.encode(text), mode="ar", max_new_tokens=24)
        for (graphs, t, mode, budget), got in runs.items():
            if t == text:
                assert got == want, (graphs, mode, budget)


def test_tp2_on_one_gpu_is_exact_in_bf16(tmp_path, one_gpu):
    """bf16: the row-invariant kernels and the rank-ordered sums keep every speculative mode on plain decoding's
    ids (the small preset: its experts split over two ranks still fit the INT4 kernel's tiles)."""
    from ddtree_chat.engine.synthetic import make_synthetic_pair

    engine = Engine.load(*make_synthetic_pair(tmp_path, preset="small", seed=0), device="cuda", tp=2, dtype="bfloat16")
    try:
        assert engine.info["cuda_graphs"] > 0
        assert_modes_keep_ar(engine, PROMPTS, (("ddtree", 16), ("ddtree", 64), ("dflash", 7)), 48)
    finally:
        engine.close()


def test_a_dead_rank_on_one_gpu_ends_the_process_with_one_line(synthetic_pair):
    assert_a_dead_rank_ends_the_process_with_one_line(*synthetic_pair, {"DDTREE_TP_ONE_GPU": "1"})


def test_nccl_collectives_of_one_rank_record_in_a_graph():
    script = textwrap.dedent("""
        import torch, torch.distributed as dist
        from ddtree_chat.engine.parallel.workers import _free_port
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
        x = torch.randn(17, 7168, device="cuda", dtype=torch.bfloat16)
        def program():
            y = x * 2
            dist.all_reduce(y)
            out = torch.empty((1, *y.shape), dtype=y.dtype, device=y.device)
            dist.all_gather_into_tensor(out, y)
            return out[0] + 1
        want = program()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            program()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            got = program()
        x.copy_(torch.randn_like(x))
        g.replay()
        assert torch.equal(got, x * 2 + 1)
        dist.destroy_process_group()
        print("OK")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    assert out.stdout.strip().endswith("OK"), out.stderr[-2000:]
