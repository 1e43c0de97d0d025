"""The benchmark scripts' own logic on CPU (their figures come from the GPU runs in BENCHMARKS.md)."""

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import auto_budget_sim  # noqa: E402
import draft_tau  # noqa: E402
import e2e  # noqa: E402
import k26_round  # noqa: E402


def test_covered_counts_overlapping_kernels_once_and_clips_to_the_window():
    assert e2e.covered([], 0, 10) == 0
    assert e2e.covered([(1, 3), (2, 5), (7, 8)], 0, 10) == 5  # [1, 5] + [7, 8]
    assert e2e.covered([(-5, 2), (9, 20)], 0, 10) == 3  # clipped to [0, 2] and [9, 10]
    assert e2e.covered([(1, 9), (2, 3)], 0, 10) == 8  # nested


def test_e2e_makes_every_reply_prefill_its_whole_prompt(engine):
    """Modes run one after another on the same prompt: without forget_prompt the engine would reuse the
    last reply's cache (its longest common prefix) and the later modes would prefill one token (whole-reply
    ratios flattered them); after it, the cache shares no prefix with the prompt."""
    from ddtree_chat.engine import GenerationConfig

    ids = engine.tokenizer.encode("the same prompt for every mode")
    list(engine.generate(ids, GenerationConfig(mode="ddtree", budget=4, max_new_tokens=4)))
    dec = engine.decoder
    assert dec.tokens[: len(ids)] == ids and dec.dcache.end_pos >= len(ids)  # what the next reply would reuse
    e2e.forget_prompt(engine, ids)
    assert dec.tokens and dec.tokens[0] != ids[0]


def test_k26_round_benchmark_runs_scaled_down_on_cpu(tmp_path):
    """benchmarks/k26_round.py end to end at tiny dims, uncaptured: every program of every round timed,
    with the bytes it must read (the real run is on the GPU)."""
    out = tmp_path / "round.json"
    assert k26_round.main(["--tiny", "--device", "cpu", "--context", "40", "--budgets", "4", "--reps", "1",
                           "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["mode"] for r in rows] == ["ar"] * 2 + ["dflash 7"] * 3 + ["ddtree 4"] * 3
    assert all(r["ms"] > 0 for r in rows)
    # ar's accept (a chain: no row moves; no drafter context) must read nothing; every other program reads
    assert [r["bytes"] > 0 for r in rows] == [True, False] + [True] * 6


def test_k26_round_times_one_tensor_parallel_rank_on_cpu(tmp_path):
    """k26_round --tp-world 2: rank 0's shards of the target and the drafter, the collectives stand-ins; each
    program reads less than the whole model's does (the verify by memory.forward_bytes of one rank)."""
    rows = {}
    for world in (1, 2):
        out = tmp_path / f"round{world}.json"
        assert k26_round.main(["--tiny", "--device", "cpu", "--context", "40", "--budgets", "4", "--reps", "1",
                               "--tp-world", str(world), "--json", str(out)]) == 0
        got = json.loads(out.read_text())
        assert got["tp_world"] == world
        rows[world] = {(r["mode"], r["program"]): r["bytes"] for r in got["rows"]}
    assert rows[1].keys() == rows[2].keys()
    draft = [k for k in rows[1] if k[1].startswith("DraftKey")]
    verify = [k for k in rows[1] if k[1].startswith("VerifyKey")]
    assert draft and verify
    assert all(0 < rows[2][k] < rows[1][k] for k in draft + verify)


def test_gpu_session_script_logs_steps_and_round_trips_its_cache(tmp_path):
    """benchmarks/gpu_session.sh (run on the GPU machine): an unknown step is logged, not fatal; without the
    cache step no archive is written, with it the cache folder comes back as archive parts that restore it
    (less Triton's intermediate IR)."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    out, cache = tmp_path / "out", tmp_path / "cache"
    out.mkdir()
    (cache / "triton").mkdir(parents=True)
    (cache / "triton" / "kernel.cubin").write_bytes(b"\x01" * 1000)
    (cache / "triton" / "kernel.llir").write_text("; IR the archive leaves out")
    env = dict(os.environ, OUT=str(out), CACHE_ROOT=str(cache))
    script = str(root / "benchmarks" / "gpu_session.sh")
    subprocess.run(["bash", script, "nosuchstep"], cwd=tmp_path, env=env, check=True, timeout=60)
    assert "unknown step nosuchstep" in (out / "log.txt").read_text()
    assert not list(out.glob("cache.tgz.part-*"))
    subprocess.run(["bash", script, "cache"], cwd=tmp_path, env=env, check=True, timeout=60)
    parts = sorted(out.glob("cache.tgz.part-*"))
    assert parts
    restored = tmp_path / "restored"
    restored.mkdir()
    subprocess.run(f"cat {' '.join(map(str, parts))} | tar xzf - -C {restored}", shell=True, check=True)
    assert (restored / "triton" / "kernel.cubin").read_bytes() == b"\x01" * 1000
    assert not (restored / "triton" / "kernel.llir").exists()


def test_gpu_session_mlaab_times_and_tests_another_version_of_the_named_file(tmp_path):
    """gpu_session.sh mlaab: the tree's file timed, then ALT_WIDE in place of ALT_OF (default the wide engine) tested
    and timed, the tree's file back afterwards; MLAAB_TESTS=0 leaves the tests out (a python stand-in records which
    version each step saw)."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    target = tmp_path / "ddtree_chat" / "csrc" / "mla_attention.cu"
    target.parent.mkdir(parents=True)
    target.write_text("TREE")
    (tmp_path / "alt.cu").write_text("ALT")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "python").write_text(f'#!/bin/sh\necho "saw $(cat {target}) for $1"\n')
    (bin_ / "python").chmod(0o755)
    for tests, want in (("1", ["TREE for benchmarks/kernels.py", "ALT for -m", "ALT for benchmarks/kernels.py"]),
                        ("0", ["TREE for benchmarks/kernels.py", "ALT for benchmarks/kernels.py"])):
        out = tmp_path / f"out{tests}"
        out.mkdir()
        env = dict(os.environ, OUT=str(out), CACHE_ROOT=str(tmp_path / "cache"), PATH=f"{bin_}:{os.environ['PATH']}",
                   ALT_WIDE="alt.cu", ALT_OF="ddtree_chat/csrc/mla_attention.cu", MLAAB_TESTS=tests)
        subprocess.run(["bash", str(root / "benchmarks" / "gpu_session.sh"), "mlaab"], cwd=tmp_path, env=env,
                       check=True, timeout=60)
        log = (out / "log.txt").read_text()
        assert [line[4:] for line in log.splitlines() if line.startswith("saw ")] == want, log
        assert target.read_text() == "TREE"


def test_k26_forward_one_layer_mode_runs_scaled_down_on_cpu(tmp_path):
    """benchmarks/k26_forward.py --layer (issue 9's one-layer benchmark) at tiny dims: one row per token
    count, a layer's bytes from memory.layer_bytes (less than the whole forward's)."""
    import k26_forward

    from ddtree_chat.engine.memory import forward_bytes, layer_bytes
    from ddtree_chat.engine.random_model import k26_config

    out = tmp_path / "layer.json"
    assert k26_forward.main(["--tiny", "--device", "cpu", "--synthetic-layers", "2", "--layer", "1", "--context", "50",
                             "--tokens", "1", "3", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["layer"] == 1 and [r["tokens"] for r in got["rows"]] == [1, 3]
    assert {r["pdl"] for r in got["rows"]} == {"0"}  # the environment's setting (the default's)
    assert all(r["eager_ms"] > 0 and r["bound_ms"] is None for r in got["rows"])
    cfg = k26_config(layers=2, **k26_round.TINY_TARGET)
    assert got["rows"][1]["bytes"] == layer_bytes(cfg, 1, 3, 50) < forward_bytes(cfg, 3, 50)["total"]


def test_k26_forward_times_one_tensor_parallel_rank_on_cpu(tmp_path):
    """--tp-world: rank 0's shard with stand-in collectives; its logits are the full vocabulary's width, and
    a rank reads less than the whole model but the whole latent cache."""
    import k26_forward

    from ddtree_chat.engine.memory import forward_bytes
    from ddtree_chat.engine.random_model import k26_config

    out = tmp_path / "rank.json"
    assert k26_forward.main(["--tiny", "--device", "cpu", "--synthetic-layers", "3", "--tp-world", "2", "--context",
                             "40", "--tokens", "1", "4", "--pdl", "0", "1", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    # --pdl: each row under each setting in turn (PDL itself is a GPU launch mode: the CPU runs the same ops)
    assert got["tp_world"] == 2 and [(r["tokens"], r["pdl"]) for r in got["rows"]] == [(1, "0"), (1, "1"), (4, "0"),
                                                                                         (4, "1")]
    cfg = k26_config(layers=3, **k26_round.TINY_TARGET)
    whole, rank = forward_bytes(cfg, 4, 40), forward_bytes(cfg, 4, 40, world=2)
    assert got["rows"][2]["bytes"] == rank["total"] < whole["total"] and rank["kv_cache"] == whole["kv_cache"]


def test_a_profile_attributes_time_to_each_op_and_its_shapes():
    """k26_forward --profile's second table: every registry op call is a range named by the op and its tensor
    arguments' shapes, so two shapes of one product are two rows; the registry is left as it was."""
    import k26_forward
    import torch

    from ddtree_chat.engine import ops
    from ddtree_chat.engine.ops.registry import Op

    run = Op.run
    x, w1, w2 = torch.randn(3, 8), torch.randn(5, 8), torch.randn(6, 8)
    with k26_forward.ops_labelled(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        ops.linear(x, w1)
        ops.linear(x, w1)
        ops.linear(x, w2)
    assert Op.run is run
    got = {key: calls for key, calls, _ in k26_forward.op_rows(prof.events())}
    assert got == {"op matmul_nt 3x8 5x8": 2, "op matmul_nt 3x8 6x8": 1}


def test_an_ops_gpu_time_is_its_kernels_time_not_its_ranges_span():
    """op_rows on a made-up GPU timeline: an op's time is the kernels inside its GPU range (idle gaps between
    launches excluded), an op served by other ops counts theirs too, and a range without kernels adds nothing."""
    from types import SimpleNamespace as NS

    import k26_forward
    import torch

    cpu, gpu = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    ev = lambda name, dev, a, b: NS(name=name, device_type=dev, time_range=NS(start=a, end=b))  # noqa: E731
    events = [ev("op outer", cpu, 0, 50), ev("op inner", cpu, 5, 40), ev("op idle", cpu, 60, 70),
              ev("op outer", gpu, 100, 190), ev("op inner", gpu, 100, 130),  # GPU ranges: first to last kernel
              ev("k1", gpu, 100, 110), ev("k2", gpu, 120, 130), ev("k3", gpu, 180, 190),  # 10 us each, gaps
              ev("aten::mm", cpu, 6, 8), ev("k4", gpu, 200, 290)]  # a kernel outside every op range
    assert k26_forward.op_rows(events) == [("op outer", 1, 30), ("op inner", 1, 20), ("op idle", 1, 0.0)]
    assert k26_forward.gpu_work(events) == [(100, 110), (120, 130), (180, 190), (200, 290)]  # the forward's launches


def test_load_speed_writes_a_k26_layout_checkpoint_and_times_a_rank_on_cpu(tmp_path):
    """benchmarks/load_speed.py at tiny dims: the checkpoint it writes loads through the engine's loader (in a
    child process), and a rank of two needs less than the files hold (one rank needs all of it)."""
    import load_speed

    out = tmp_path / "speed.json"
    assert load_speed.main(["--dir", str(tmp_path / "ckpt"), "--tiny", "--device", "cpu", "--layers", "2",
                            "--tp-world", "2", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    total = json.loads((tmp_path / "ckpt" / "model.safetensors.index.json").read_text())["metadata"]["total_size"]
    assert got["layers"] == 2 and got["load_s"] > 0 and got["peak_rss_bytes"] > 0 and not got["experts_packed"]
    assert load_speed.rank_bytes(tmp_path / "ckpt", 1) == total and got["rank_bytes"] < total <= got["file_bytes"]
    assert "storage_read_bytes" in got  # NOTE: its value depends on the file system (0 on tmpfs, dirty pages)
    # --packed: the same load with the experts kept packed (as a GPU keeps them), in its child process
    assert load_speed.main(["--dir", str(tmp_path / "ckpt"), "--tiny", "--device", "cpu", "--tp-world", "2",
                            "--packed", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["experts_packed"] is True


def test_allreduce_benchmark_runs_two_ranks_on_cpu_and_finds_the_crossover(tmp_path):
    """benchmarks/allreduce.py: two gloo ranks report a time per size; the crossover is the smallest size
    from which NCCL stays at least as fast as the one-shot."""
    import allreduce

    out = tmp_path / "ar.json"
    assert allreduce.main(["--world", "2", "--device", "cpu", "--sizes", "4096", "16384", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert [r["bytes"] for r in got["rows"]] == [4096, 16384] and all(r["gloo_us"] > 0 for r in got["rows"])
    rows = [{"bytes": 1, "oneshot_us": 5, "nccl_us": 20}, {"bytes": 2, "oneshot_us": 9, "nccl_us": 8},
            {"bytes": 3, "oneshot_us": 12, "nccl_us": 14}, {"bytes": 4, "oneshot_us": 30, "nccl_us": 20}]
    assert allreduce.crossover(rows) == 4 and allreduce.crossover(rows[:1]) is None


def test_tp_projection_adds_up_what_it_assumes():
    """benchmarks/tp_projection.py: a round is the bandwidth-scaled forward + 122 all-reduces + the draft; tokens
    per round over its time; at the bound the forward is bound x factor and the drafter split over the ranks."""
    import tp_projection

    rows = [{"context": 64, "tokens": t, "collective_us": 0.0, "graph_ms": g, "eager_ms": 9.0, "bound_ms": b}
            for t, g, b in ((1, 2.0, 1.0), (8, 3.0, 2.0), (17, 4.0, 3.0))]
    got = tp_projection.project({"tp_world": 8, "rows": rows}, 200.0, 100.0, {1: 10.0, 8: 20.0, 17: 40.0}, 1.0, 6,
                                (2.0, 4.0), 1.5)
    by = {(r["mode"], r["when"]): r for r in got}
    ar = by["ar", "today"]
    assert ar["round_ms"] == 2.0 * 2 + 122 * 0.01 and ar["tok_s"] == [1e3 / ar["round_ms"]] * 2
    tree = by["ddtree 16 (17 rows)", "at bound"]
    assert abs(tree["round_ms"] - (1.5 * 3.0 * 2 + 122 * 0.04 + 2.0 / 8 + 12 * 0.01)) < 1e-9
    assert tree["tok_s"] == [2e3 / tree["round_ms"], 4e3 / tree["round_ms"]]
    # a rank's measured drafts (k26_round --tp-world): today's draft is that, scaled, plus the split's all-reduces
    measured = {"rows": [{"mode": "dflash 7", "program": "DraftKey(...)", "ms": 0.3},
                         {"mode": "ddtree 16", "program": "DraftKey(...)", "ms": 0.4},
                         {"mode": "ddtree 16", "program": "VerifyKey(...)", "ms": 9.0},
                         {"mode": "ddtree 32", "program": "DraftKey(...)", "ms": 0.9}]}
    drafts = tp_projection.rank_drafts(measured)
    assert drafts == {"dflash (8 rows)": 0.3, "ddtree 16 (17 rows)": 0.4}
    got = tp_projection.project({"tp_world": 8, "rows": rows}, 200.0, 100.0, {1: 10.0, 8: 20.0, 17: 40.0}, 1.0, 6,
                                (2.0, 4.0), 1.5, rank_draft_ms=drafts)
    by2 = {(r["mode"], r["when"]): r for r in got}
    assert abs(by2["ddtree 16 (17 rows)", "today"]["draft_ms"] - (0.4 * 2 + 12 * 0.01)) < 1e-9
    assert by2["ddtree 16 (17 rows)", "at bound"] == tree and by2["ar", "today"] == ar


def test_layer_bytes_add_up_to_the_forward():
    from ddtree_chat.engine.memory import forward_bytes, layer_bytes
    from ddtree_chat.engine.random_model import k26_config

    cfg = k26_config(layers=3)  # one dense layer, two MoE layers
    for t in (1, 16, 64):
        whole = forward_bytes(cfg, t, 4096)
        layers = sum(layer_bytes(cfg, i, t, 4096) for i in range(3))
        assert abs(layers + whole["lm_head"] - whole["total"]) < 1e-6 * whole["total"]
    assert layer_bytes(cfg, 1, 64, 4096) > 2 * layer_bytes(cfg, 1, 1, 4096)  # a MoE layer: more experts touched


def test_op_counts_lists_every_reference_a_kernel_replaces(tmp_path):
    """benchmarks/op_counts.py: the per-call torch op counts the kernels' docstrings quote (each reference
    issues several ops where its kernel is one launch, and the tree references grow with depth)."""
    import op_counts

    out = tmp_path / "ops.json"
    assert op_counts.main(["--json", str(out)]) == 0
    counts = json.loads(out.read_text())
    assert len(counts) == 7 and all(n >= 4 for n in counts.values())
    shallow, deep = op_counts.references(depth=2), op_counts.references(depth=7)
    assert len(deep["DraftTree.mask_ref (depth 7)"]) > len(shallow["DraftTree.mask_ref (depth 2)"])


def test_benchmarks_load_the_drafter_given_alone(tmp_path):
    """--draft without --target reaches the engine, as in the CLI (e2e.py and draft_tau.py once ignored it and
    measured the shipped drafter): a drafter folder that does not exist is a clear error."""
    from ddtree_chat.engine.errors import ConfigError

    for script in (draft_tau, e2e):
        with pytest.raises(ConfigError, match="nothing/config.json not found"):
            script.main(["--draft", str(tmp_path / "nothing"), "--prompts", "1", "--max-new", "4"])


def test_draft_tau_compares_the_engine_with_the_training_measure_on_cpu(tmp_path):
    """benchmarks/draft_tau.py on one held-out prompt: both acceptance measures within [1, block]; the
    best-first trees' tokens per round grow with the budget (each tree holds the smaller ones), one node
    emits at most 2; one calibration row per drafted depth (no figures where no matched chain reached it); the
    block tau by place in the reply."""
    out = tmp_path / "tau.json"
    assert draft_tau.main(["--prompts", "1", "--max-new", "24", "--budgets", "1", "7", "32", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert len(res["rows"]) == 1 and res["rows"][0]["anchors"] > 0
    assert 1 <= res["engine_tokens_per_forward"] <= 8 and 1 <= res["block_tau"] <= 8
    trees = {int(b): t for b, t in res["tree_tau"].items()}
    assert 1 <= trees[1] <= 2 and trees[1] <= trees[7] <= trees[32] <= 8
    cal = res["calibration"]
    assert len(cal) == 7 and cal[0]["anchors"] > 0 and all(0 <= c["top1_hit"] <= 1 for c in cal if c["anchors"])
    assert all(c["top1_hit"] is None for c in cal if not c["anchors"])  # a depth no matched chain reached
    assert "0-8" in res["tau_along_reply"] and all(1 <= t <= 8 for t in res["tau_along_reply"].values())


def test_exact_sweep_keeps_the_ar_step_then_picks_the_least_worst_ratio_to_cublas():
    """kernels.py --only exact: one tile serves every row count; of the tiles whose one-row time is within 3% of
    cuBLAS, the least slowest ratio over M; a tile that failed at some M is never picked."""
    import kernels

    lib = {1: 10.0, 17: 20.0, 65: 40.0}
    times = {"fast at one row": {1: 8.0, 17: 30.0, 65: 80.0}, "even": {1: 10.2, 17: 22.0, 65: 44.0},
             "slow at one row": {1: 12.0, 17: 21.0, 65: 41.0}, "failed": {1: 1.0, "error": "OutOfResources"}}
    win = kernels.exact_winners(times, lib)  # "slow at one row" has the least worst ratio, but costs the AR step
    assert win["tile"] == "even" and win["worst_x_cublas"] == 1.1
    assert win["fastest_by_m"] == {1: "fast at one row", 17: "slow at one row", 65: "slow at one row"}
    assert kernels.exact_winners({"failed": times["failed"]}, lib) == {}
    from ddtree_chat.engine.ops import triton_exact_linear as el

    assert kernels.EXACT_TILES[0] == el.DEFAULT_TILE


def test_profile_round_times_a_rounds_programs_on_the_cpu(tmp_path, capsys):
    """benchmarks/profile_round.py --device cpu: the demo pair's reply per mode (wall time, rounds) and, with
    --programs, each program of the round (draft, verify, accept) run directly, each with a time; --verify-sizes,
    the verify's time per node count."""
    import profile_round

    out = tmp_path / "round.json"
    assert profile_round.main(["--device", "cpu", "--modes", "ddtree:8", "--max-new", "8", "--programs",
                               "--verify-sizes", "2", "9", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    costs = data["verify_ms"]  # --verify-sizes: a plain step's verify, then each size's
    assert list(costs) == ["plain", "2", "9"] and all(v > 0 for v in costs.values())
    got = data["ddtree:8"]
    assert got["tokens"] == 8 and 1 <= got["rounds"] <= 8 and got["wall_s"] > 0
    assert [p["key"][0] for p in got["programs"]] == ["draft", "verify", "accept"]
    assert all(p["ms"] > 0 for p in got["programs"]) and "## ddtree:8: 8 tokens" in capsys.readouterr().out


def test_the_forward_benchmark_times_the_target_as_the_engine_fuses_it():
    """k26_forward's target reads q_a and kv_a in one product, as the Decoder's does (its table tile is the
    fused shape's), on the CPU at tiny dims."""
    import k26_forward
    import torch

    from ddtree_chat.engine.parallel.group import SINGLE
    from ddtree_chat.engine.random_model import k26_config

    cfg = k26_config(layers=2, **k26_round.TINY_TARGET)
    model = k26_forward.build_target(cfg, torch.device("cpu"), torch.float32, SINGLE)
    assert all(layer.self_attn.qkv_a_weight is not None for layer in model.layers)


def test_a_replays_idle_time_is_summed_by_the_item_that_follows_it():
    """replay_gaps on a made-up replay: the span runs first start to last end, the work is the items' own
    time, each idle stretch counts against the item after it (overlap counts as none)."""
    import k26_forward

    items = [(0, 10, "a"), (12, 20, "b"), (25, 30, "a"), (29, 40, "c"), (41, 45, "b")]
    got = k26_forward.replay_gaps(items)
    assert got["span_us"] == 45 and got["work_us"] == 10 + 8 + 5 + 11 + 4
    assert got["gap_by_next"] == [("a", 1, 5), ("b", 2, 3), ("c", 1, 0.0)]


def test_cpu_products_counts_a_forwards_products_and_the_experts_tokens_pick():
    import cpu_products
    from types import SimpleNamespace

    import torch

    model = torch.nn.ModuleDict({"embed_tokens": torch.nn.Embedding(50, 8), "a": torch.nn.Linear(8, 4, bias=False),
                                 "b": torch.nn.Linear(8, 4, bias=False), "lm_head": torch.nn.Linear(8, 50, bias=False),
                                 "norm": torch.nn.LayerNorm(8)})
    assert cpu_products.dense_shapes(model) == {(4, 8): 2, (50, 8): 1}  # no lookup, no 1-D weight
    cfg = SimpleNamespace(n_routed_experts=16, num_experts_per_tok=4, hidden_size=8, moe_intermediate_size=4)
    calls = []
    unit = lambda n, k, rows: calls.append(rows) or 1.0  # noqa: E731 - one unit per product
    assert cpu_products.expert_us(cfg, 5, 1, unit) == 5 * 4 * 3 and set(calls) == {1}  # 4 experts, 1 row each
    many = cpu_products.expert_us(cfg, 5, 64, unit)
    assert 5 * 15.9 * 3 < many <= 5 * 16 * 3 and calls[-1] == 16  # every expert, 64 x 4 / 16 rows each
    shapes = []
    dense = cpu_products.expert_us(cfg, 5, 9, lambda n, k, rows: shapes.append((n, k, rows)) or 1.0, dense=True)
    assert dense == 5 * 3 and set(shapes) == {(64, 8, 9), (8, 64, 9)}  # gate, up [E * I, H], down [H, E * I], all rows


def test_e2e_under_a_repeat_penalty_adds_plain_ar_beside_the_penalised_modes(synthetic_pair, tmp_path, capsys):
    """--repeat-penalty: every mode penalised and checked against the penalised ar, plus one ar row without the
    penalty (its ids differ by design, so it is not checked), all in one run."""
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps([{"user": "a", "prompt_ids": [5, 6, 7, 5, 6]}, {"user": "b", "prompt_ids": [9, 9]}]))
    out = tmp_path / "e2e.json"
    rc = e2e.main(["--target", str(synthetic_pair[0]), "--draft", str(synthetic_pair[1]), "--device", "cpu",
                   "--prompts-json", str(prompts), "--max-new", "24", "--budgets", "8", "--repeat-penalty", "1.5",
                   "--json", str(out)])
    res = json.loads(out.read_text())["results"]
    assert rc == 0 and set(res) == {"ar-0", "dflash-7", "ddtree-8", "ar-plain"}
    assert all(res[k]["mismatch"] == 0 for k in res) and res["ar-plain"]["tokens"] == res["ar-0"]["tokens"]
    assert "| ar | no penalty |" in capsys.readouterr().out


def test_e2e_history_sends_each_request_after_the_ones_before_it_and_their_replies(engine):
    """--history 2: request i is the last user turn of a chat holding requests i-2 and i-1 (cyclically) and the
    target's own greedy replies to them, in the chat template's form."""
    from ddtree_chat.engine import GenerationConfig

    tok = engine.tokenizer
    users = ["first request", "second one", "a third"]
    plain = [{"user": u, "prompt_ids": tok.render_chat([{"role": "user", "content": u}])} for u in users]

    def reply(i):
        *_, last = engine.generate(plain[i]["prompt_ids"], GenerationConfig(mode="ar", max_new_tokens=6))
        return tok.decode(last["token_ids"], skip_special=True)

    got = e2e.with_history(engine, plain, 2, 6)
    assert [g["user"] for g in got] == users
    turns = [{"role": "user", "content": users[2]}, {"role": "assistant", "content": reply(2)},
             {"role": "user", "content": users[0]}, {"role": "assistant", "content": reply(0)},
             {"role": "user", "content": users[1]}]
    assert got[1]["prompt_ids"] == tok.render_chat(turns) != plain[1]["prompt_ids"]


def test_the_auto_budget_simulation_takes_trees_that_pay_and_leaves_those_that_do_not(tmp_path):
    """Trees at 3x plain steps' rate run in most rounds, trees at half their rate in almost none; the JSON holds a
    share per ratio and seed."""
    out = auto_budget_sim.main(["--ratios", "0.5", "3", "--rounds", "3000", "--settle", "500", "--seeds", "2",
                                "--json", str(tmp_path / "sim.json")])
    assert json.loads((tmp_path / "sim.json").read_text()) == json.loads(json.dumps(out))
    slow, fast = out["shares"]["0.5"], out["shares"]["3.0"]
    assert len(slow) == len(fast) == 2 and max(slow) < 0.05 and min(fast) > 0.8


def test_auto_takes_trees_that_pay_a_third_more_than_plain_steps_on_cpu_like_costs():
    """A 15 ms plain step, a 28 ms tree round (the demo pair on the CPU) whose tokens make trees 1.3x plain steps'
    rate: they run in nearly every round (at TREE_DECAY 0.9 with a standard-error bound, 25-100% by seed)."""
    out = auto_budget_sim.main(["--ratios", "1.3", "--rounds", "6000", "--settle", "1000", "--seeds", "3",
                                "--plain-ms", "15", "--tree-ms", "28.4"])
    assert min(out["shares"]["1.3"]) > 0.9



def test_ncu_table_reads_each_launchs_counters_in_us_after_ncus_warnings(tmp_path):
    """benchmarks/ncu_table.py: the header found after ncu's warnings, a launch's metrics gathered from its rows,
    each duration in us whatever unit ncu picked, word-valued metrics left out, skipped kernels dropped."""
    import ncu_table

    head = ('"ID","Process ID","Kernel Name","Block Size","Grid Size","Section Name","Metric Name","Metric Unit",'
            '"Metric Value"')

    def rows(i, name, grid, metrics):
        return [f'"{i}","7","{name}","(128, 1, 1)","{grid}","S","{m}","{u}","{v}"' for m, u, v in metrics]

    text = "\n".join(["==WARNING== Note: Running with unmodified GPU clocks.", "", head,
                      *rows(2, "_merge_kernel", "(8, 16, 1)",
                            [("Duration", "us", "10.56"), ("DRAM Throughput", "%", "12.03"), ("L2 Cache Hit", "", "n/a")]),
                      *rows(1, "_mla_exact_kernel", "(1, 257, 1)",
                            [("Duration", "ns", "66,592"), ("Registers Per Thread", "register/thread", "255")]),
                      *rows(3, "vectorized_elementwise", "(1, 1, 1)", [("Duration", "ms", "0.002304")])])
    runs = ncu_table.launches(text)
    assert [r["id"] for r in runs] == [1, 2, 3]
    assert runs[0]["Duration"] == pytest.approx(66.592) and runs[0]["Registers Per Thread"] == 255
    assert runs[1]["DRAM Throughput"] == 12.03 and "L2 Cache Hit" not in runs[1]
    assert runs[2]["Duration"] == pytest.approx(2.304)
    out = ncu_table.table(runs, ("elementwise",))
    assert "| 1 | _mla_exact_kernel | (1, 257, 1) | (128, 1, 1) | 66.59 |" in out and "elementwise" not in out
    path = tmp_path / "bad.csv"
    path.write_text("no table here\n")
    assert ncu_table.main([str(path)]) == 1


def test_ncu_sass_ranks_a_launchs_sass_lines_by_their_stall_samples():
    """benchmarks/ncu_sass.py: the header found after ncu's own lines, samples read with thousands separators,
    the lines ranked by samples with their share of all, and one clear error for a file without the columns."""
    import ncu_sass

    text = "\n".join(['==PROF== Connected to process 7', '"# Address","Source","Warp Stall Sampling (All Samples)",'
                      '"Warp Stall Sampling (Not-issued Samples)","Instructions Executed"',
                      '"0x10","LDS.128 R4, [R2]","120","100","1,024"',
                      '"0x20","HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24","2,000","40","512"',
                      '"0x30","SYNCS.PHASECHK.TRANS64 P0, [UR8], R3","880","870","64"'])
    lines = ncu_sass.sampled_lines(text)
    assert [x["samples"] for x in lines] == [120, 2000, 880] and lines[2]["not_issued"] == 870
    out = ncu_sass.table(lines, top=2)
    assert out.splitlines()[0].startswith("3000 warp samples over 3 SASS lines")
    assert "| 0x20 | 2000 | 66.7 | 40 | `HGMMA" in out and "| 0x30 | 880 | 29.3 |" in out and "LDS" not in out
    with pytest.raises(ValueError, match="SourceCounters"):
        ncu_sass.sampled_lines('"Address","Source","Instructions Executed"\n"0x10","NOP","1"')
    with pytest.raises(ValueError, match="not an ncu"):
        ncu_sass.sampled_lines("no table here")
