"""train.py's target training across calls: a run paused (deadline, steps per call) and resumed exports the same
weights as one run, its data stage is cached (or copied from another run's, --data-from), a checkpoint it cannot
continue is refused in one line, and a fresh run's step 0 skips the generation probes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_chat.dev.demo import common, train

ROOT = Path(__file__).resolve().parents[1]
# A 0.8M-parameter target on 12 stdlib files, validated every 2 steps, all of them under QAT: ~1 s a call.
# lr 0.1: the validation loss wanders, so the kept step is not simply the last one.
TINY = ["--toy", "--stages", "data,target", "--limit-files", "12", "--heldout-probe", "0", "--copy-probe", "0",
        "--target-arch", "hidden=64,layers=2,heads=2,q_lora=32,kv_lora=32,nope=16,rope=8,v=16,inter=128,moe_inter=32,"
        "experts=4,top_k=2,shards=1", "--target-steps", "10", "--target-val-every", "2", "--qat-frac", "1",
        "--target-lr", "0.1"]


@pytest.fixture(autouse=True)
def _target_sizes():
    saved = dict(common.TARGET)  # --target-arch changes the shared sizes in place
    yield
    common.TARGET.clear()
    common.TARGET.update(saved)


def _exported(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "target").iterdir()) if p.suffix == ".safetensors"}


def test_a_paused_and_resumed_run_exports_the_same_weights_as_one_run(tmp_path, capsys):
    one, split = tmp_path / "one", tmp_path / "split"
    assert train.main(["--out", str(one)] + TINY) == 0
    whole = json.loads((one / "target_train.json").read_text())
    assert not (one / train.CKPT).exists() and (one / train.DONE).exists()
    capsys.readouterr()
    # Pause right after the kept step (when it is not the last), so the kept weights must come through the checkpoint.
    k = whole["kept_step"] + 1 if whole["kept_step"] < whole["steps"] - 1 else whole["steps"] // 2
    # 1: the deadline is already past, so one step; 2: up to step k; 3: the rest and the export.
    assert train.main(["--out", str(split), "--resume", "--target-deadline", "0"] + TINY) == 0
    first = capsys.readouterr().out
    assert "starting afresh" in first and "paused at step 1 of 10" in first
    assert (split / train.CKPT).exists() and not (split / "target").exists()
    assert train.main(["--out", str(split), "--resume", "--target-steps-per-call", str(k - 1)] + TINY) == 0
    second = capsys.readouterr().out
    assert "data stage skipped" in second and "resuming at step 1 of 10" in second
    assert f"paused at step {k} of 10" in second and not (split / "target").exists()
    assert train.main(["--out", str(split), "--resume"] + TINY) == 0
    resumed = json.loads((split / "target_train.json").read_text())
    assert _exported(split) == _exported(one) and len(_exported(one)) == 1
    assert resumed["loss_curve"] == whole["loss_curve"] and resumed["kept_step"] == whole["kept_step"]
    assert resumed["resumed_at_steps"] == [1, k] and not (split / train.CKPT).exists()
    # Finished: --resume again finds the export and trains nothing.
    capsys.readouterr()
    assert train.main(["--out", str(split), "--resume"] + TINY) == 0
    assert "nothing to resume" in capsys.readouterr().out and _exported(split) == _exported(one)


def test_a_checkpoint_of_other_settings_or_unreadable_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        train.main(["--out", str(tmp_path / "never"), "--target-steps-per-call", "0"] + TINY)
    assert "--target-steps-per-call must be at least 1" in capsys.readouterr().err
    out = tmp_path / "run"
    assert train.main(["--out", str(out), "--target-steps-per-call", "1"] + TINY) == 0
    ckpt = out / train.CKPT
    assert ckpt.exists()
    capsys.readouterr()
    # Other data (a changed input file list rebuilds the cached data stage): the checkpoint does not fit it.
    other = [x if x != "12" else "10" for x in TINY]
    assert train.main(["--out", str(out), "--resume"] + other) == 1
    cap = capsys.readouterr()
    assert "settings or input files changed" in cap.out
    assert len(cap.err.strip().splitlines()) == 1 and str(ckpt) in cap.err and "data" in cap.err
    ckpt.write_bytes(b"not a checkpoint")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-m", "ddtree_chat.dev.demo.train", "--out", str(out), "--resume"] + other,
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "data stage skipped" in run.stdout
    assert run.stderr.strip().splitlines() == [run.stderr.strip()] and "Traceback" not in run.stderr
    assert str(ckpt) in run.stderr and "unreadable" in run.stderr
    assert ckpt.read_bytes() == b"not a checkpoint"  # left for the user to look at


def test_a_target_takes_the_data_stage_of_another_run_of_the_same_settings(tmp_path, capsys, monkeypatch):
    """--data-from: a run whose data settings and input files match copies that run's cached data stage (what a
    sweep's targets of one data setting share) and trains the same weights as on data of its own; with other
    settings it builds its own; the copy is then its cache for --resume."""
    from ddtree_chat.dev.demo import data

    shared, own, other = tmp_path / "data", tmp_path / "own", tmp_path / "other"
    assert train.main(["--out", str(shared), *TINY, "--stages", "data"]) == 0
    assert train.main(["--out", str(own)] + TINY) == 0
    capsys.readouterr()

    def never(*args, **kwargs):
        raise AssertionError("tokenised again")

    with monkeypatch.context() as m:
        m.setattr(data, "prepare", never)
        copied = tmp_path / "copied"
        assert train.main(["--out", str(copied), "--data-from", str(shared), "--resume",
                           "--target-steps-per-call", "4"] + TINY) == 0
        assert "data: copied from" in capsys.readouterr().out
        assert train.main(["--out", str(copied), "--data-from", str(shared), "--resume"] + TINY) == 0
        assert "data stage skipped" in capsys.readouterr().out
    for f in data.OUTPUTS + (data.KEY_FILE,):
        assert (copied / f).read_bytes() == (shared / f).read_bytes()
    assert _exported(copied) == _exported(own)
    with pytest.raises(AssertionError, match="tokenised again"), monkeypatch.context() as m:
        m.setattr(data, "prepare", never)
        train.main(["--out", str(other), "--data-from", str(shared)] + [x if x != "12" else "10" for x in TINY])


def test_step_0_of_a_fresh_run_skips_the_generation_probes(tmp_path, capsys, monkeypatch):
    """Untrained weights answer nothing: step 0 logs its losses without the copy and held-out probes (null and {}
    in the curve); the later validation steps and the kept weights' check run them."""
    from ddtree_chat.dev.demo import copy_probe

    probed = []
    monkeypatch.setattr(copy_probe, "copy_rate", lambda *a, **k: probed.append("copy") or 1)
    held = {"n": 20, "defines": 2, "passes": 0, "def_line": 3}
    monkeypatch.setattr(copy_probe, "heldout_rate", lambda *a, **k: probed.append("heldout") or held)
    assert train.main(["--out", str(tmp_path)] + TINY + ["--copy-probe", "2", "--heldout-probe", "4"]) == 0
    res = json.loads((tmp_path / "target_train.json").read_text())
    curve = res["loss_curve"]
    assert [c[0] for c in curve] == [0, 2, 4, 6, 8, 9]
    assert curve[0][3:] == [None, {}] and all(c[3] == 1 and c[4]["defines"] == 2 for c in curve[1:])
    assert probed == ["copy", "heldout"] * len(curve)  # steps 2 to 9, then the kept weights' check
    out = capsys.readouterr().out
    assert "step 0/10" in out and "probes from the next validation step" in out and "copy 1/" in out


def test_the_drafter_asks_for_new_tasks_and_validates_on_held_out_ones(tmp_path, capsys):
    """--draft-novel-tasks: tasks no training request names are new to the target; some are held out of the
    drafter's requests and validate it ('new tasks tau'), the rest fill --draft-novel's share of its requests.
    --draft-refills 3: the second pool of continuations comes from the other prompt batch, and with none left for a
    third, training goes on with the second. The whole distilled data, target and draft stages on 300 teacher
    answers of the committed data set."""
    import tarfile

    distil = tmp_path / "distil"
    distil.mkdir()
    with tarfile.open(ROOT / "training" / "demo-distil-data.tar.xz") as tar:
        for name in ("meta.json", "prompts.jsonl", "answers.jsonl"):
            lines = tar.extractfile(f"distil/{name}").read().decode().splitlines(keepends=True)
            (distil / name).write_text("".join(lines if name == "meta.json" else lines[:300]))
    tasks = tmp_path / "proposals"
    tasks.mkdir()
    (tasks / "proposals.jsonl").write_text("".join(
        json.dumps({"name": f"tally_item_{i}", "args": "xs", "does": f"returns how often item {i} occurs in xs",
                    "status": "ok", "batch": 0}) + "\n" for i in range(40)))
    arch = TINY[TINY.index("--target-arch") + 1].replace("layers=2", "layers=6")  # the drafter reads layers 1, 3, 5
    argv = [x if x != TINY[TINY.index("--target-arch") + 1] else arch for x in TINY]
    argv[argv.index("data,target")] = "data,target,draft"
    out = tmp_path / "out"
    assert train.main(["--out", str(out), "--distil", str(distil), "--draft-novel", "0.25",
                       "--draft-novel-tasks", str(tasks), "--draft-steps", "3", "--draft-refills", "3",
                       "--device", "cpu"] + argv) == 0
    log = capsys.readouterr().out
    assert "40 of the 40 tasks" in log and "20 of them held out" in log and "new tasks tau" in log
    res = json.loads((out / "draft_train.json").read_text())
    assert res["new_task_prompts"] == 20 and 0 < res["new_task_requests"] <= round(16 * 0.25) + 1
    assert res["variants"]["3x1024"]["new_tasks_tau"] >= 1 and all("new_tasks_tau" in c for c in res["curve"])
    # the toy pool is 2 batches of 8 prompts, one batch a fill
    assert (res["fills"], res["gen_batches"], res["gen_sequences"]) == (2, 2, 16)
    assert "fill 2: 8 sequences" in log and "no unused prompt batch left" in log
