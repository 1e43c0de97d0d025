"""ddtree_chat/dev/demo/gpu_run.sh's sweep: each target's fields reach train.py's flags, targets of the same data
settings share one data stage, and with RESUME=1 a run continues its checkpoint and pauses before the step's limit
(python3 and the clock stubbed)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path, steps: list[str], **env) -> list[list[str]]:
    """Runs gpu_run.sh with python3 stubbed to record its arguments; returns them, one list per call. The clock
    (`date`) is stubbed too: it stands still but for 100 s that each data-only train.py call takes."""
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    calls, clock = tmp_path / "calls.txt", tmp_path / "clock"
    calls.unlink(missing_ok=True)
    clock.write_text("1000000\n")
    bump = f"echo $(( $(cat {clock}) + 100 )) > {clock}"
    (stub / "python3").write_text(f'#!/bin/sh\necho "$*" >> {calls}\ncase " $* " in *" --stages data "*) {bump};; esac\n')
    (stub / "date").write_text(f"#!/bin/sh\ncat {clock}\n")
    for f in ("python3", "date"):
        (stub / f).chmod(0o755)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if k not in ("RESUME", "TARGET_MARGIN", "CKPT_EVERY", "TARGETS")}
    env = dict(base, OUT=str(out), PATH=f"{stub}:{os.environ['PATH']}", SWEEP=str(tmp_path / "sweep"), **env)
    subprocess.run(["bash", "ddtree_chat/dev/demo/gpu_run.sh", *steps], cwd=ROOT, env=env, check=True, timeout=60)
    return [line.split() for line in calls.read_text().splitlines()] if calls.exists() else []


def test_sweep_fields_become_train_flags(tmp_path):
    calls = _run(tmp_path, ["sweep"], TARGETS="8:4:20:hidden=384:mixed:everyday+self:0.3 2:1:10")
    trains = [c for c in calls if "ddtree_chat.dev.demo.train" in c]
    assert len(trains) == 2 and not any("--data-from" in t for t in trains)  # no data settings in common
    full, bare = sorted(trains, key=len, reverse=True)
    assert full[full.index("--qat-frac") + 1] == "0.3" and full[full.index("--target-arch") + 1] == "hidden=384"
    assert full[full.index("--rename-pool") + 1] == "mixed" and "/tmp/self" in full and "/tmp/everyday" in full
    assert full[full.index("--target-steps") + 1] == "20" and full[full.index("--renames") + 1] == "8"
    assert "--qat-frac" not in bare and "--target-arch" not in bare and "--rename-pool" not in bare
    assert bare[bare.index("--target-steps") + 1] == "10"
    assert bare[bare.index("--out") + 1] == str(tmp_path / "sweep" / "2-1-10")
    assert not any("--resume" in t or "--target-deadline" in t for t in trains)  # one call trains, as before
    assert len([c for c in calls if "ddtree_chat.dev.demo.eval_heldout" in c]) == 2


def _flags(call: list[str], *names: str) -> list[tuple[str, ...]]:
    """The call's arguments from each flag in names to the next flag."""
    out = []
    for name in names:
        i = call.index(name)
        j = next((k for k in range(i + 1, len(call)) if call[k].startswith("--")), len(call))
        out.append(tuple(call[i:j]))
    return out


def test_sweep_targets_of_the_same_data_settings_share_one_data_stage(tmp_path):
    """Targets whose RENAMES:NAME_WEIGHT, POOL and SETS agree get one data stage, run before them, and copy it
    (--data-from); a target of other data settings builds its own; the data stage's time comes out of theirs."""
    calls = _run(tmp_path, ["sweep"], RESUME="1",
                 TARGETS="8:4:20:hidden=384:mixed:everyday+self 8:4:30::mixed:everyday+self:0.3 8:4:20::mixed:everyday")
    data = calls[0]  # first and alone: the targets start once it is done
    shared = tmp_path / "sweep" / "data-8-4-mixed-everyday_self"
    assert data[data.index("--stages") + 1] == "data" and data[data.index("--out") + 1] == str(shared)
    assert "--resume" not in data and "--data-from" not in data
    targets = sorted((c for c in calls[1:] if "ddtree_chat.dev.demo.train" in c), key=lambda t: t[t.index("--out") + 1])
    assert len(targets) == 3 and all(t[t.index("--stages") + 1] == "data,target" for t in targets)
    other, *same = targets  # sweep/8-4-20--mixed-everyday sorts first
    want = _flags(data, "--distil", "--renames", "--name-weight", "--rename-pool")
    assert want[0] == ("--distil", "/tmp/distil", "/tmp/everyday", "/tmp/self")
    for t in same:
        assert _flags(t, "--distil", "--renames", "--name-weight", "--rename-pool") == want
        assert t[t.index("--data-from") + 1] == str(shared)
    assert "--data-from" not in other and "/tmp/self" not in other
    # the stubbed data stage took 100 s: each target pauses 80 s before what is left of the step's 500 s
    assert {t[t.index("--target-deadline") + 1] for t in targets} == {"320"}


def test_resumed_sweep_pauses_before_the_limit_and_evaluates_exported_targets_only(tmp_path):
    """RESUME=1: every target continues its checkpoint and pauses 80 s before the step's 500 s (less its shared data
    stage's 100 s); eval-target runs for a target exported in this call, not for one still paused, nor for one
    evaluated after its export."""
    sweep = tmp_path / "sweep"
    paused, done, evaluated = sweep / "2-1-10", sweep / "2-1-11", sweep / "2-1-12"
    paused.mkdir(parents=True)
    (paused / "target_ckpt.pt").write_bytes(b"")
    for d in (done, evaluated):
        (d / "target").mkdir(parents=True)
        (d / "target_train.json").write_text("{}")
    os.utime(evaluated / "target_train.json", (1_000_000, 1_000_000))
    (evaluated / "heldout_target.json").write_text("{}")
    calls = _run(tmp_path, ["sweep"], TARGETS="2:1:10 2:1:11 2:1:12", RESUME="1")
    trains = [c for c in calls if "ddtree_chat.dev.demo.train" in c and "data,target" in c]
    assert len(trains) == 3
    for t in trains:
        assert "--resume" in t and t[t.index("--target-deadline") + 1] == "320"
        assert t[t.index("--target-checkpoint-every") + 1] == "500"
    evals = [c for c in calls if "ddtree_chat.dev.demo.eval_heldout" in c]
    assert [e[e.index("--target") + 1] for e in evals] == [str(done / "target")]
    log = (tmp_path / "out" / "sweep-2-1-10.txt").read_text()
    assert "eval-target skipped" in log and "paused" in log
    target = _run(tmp_path, ["target"], RESUME="1", TARGET_MARGIN="100", CKPT_EVERY="300")
    assert target[0][target[0].index("--target-deadline") + 1] == "200" and "--resume" in target[0]
    assert target[0][target[0].index("--target-checkpoint-every") + 1] == "300"


def test_target_step_takes_a_sweep_targets_arch_qat_and_a_longer_limit(tmp_path):
    """`target` passes TARGET_ARCH and QAT_FRAC on as the sweep's fields do, and RESUME=1's deadline follows
    TARGET_LIMIT (default 300 s)."""
    call = _run(tmp_path, ["target"], TARGET_ARCH="hidden=384,inter=1152", QAT_FRAC="0.3", TARGET_LIMIT="540",
                RESUME="1")[0]
    assert call[call.index("--target-arch") + 1] == "hidden=384,inter=1152"
    assert call[call.index("--qat-frac") + 1] == "0.3" and call[call.index("--target-deadline") + 1] == "460"
    bare = _run(tmp_path, ["target"])[0]
    assert "--target-arch" not in bare and "--qat-frac" not in bare and "--target-deadline" not in bare


def test_a_drafter_for_a_finished_target_runs_its_data_stage_and_is_evaluated_with_it(tmp_path):
    """TARGET_FROM: the draft step builds the data stage against that target (its tokenizer, the given data
    settings) and eval pairs the new drafter with it; without it the draft step trains after `target` as before."""
    calls = _run(tmp_path, ["draft", "eval"], TARGET_FROM="ddtree_chat/assets/demo/target", RENAMES="8",
                 RENAME_POOL="mixed")
    draft, ev = calls
    assert draft[draft.index("--target-from") + 1] == "ddtree_chat/assets/demo/target"
    assert draft[draft.index("--stages") + 1] == "data,draft" and draft[draft.index("--renames") + 1] == "8"
    assert draft[draft.index("--rename-pool") + 1] == "mixed"
    assert ev[ev.index("--target") + 1] == "ddtree_chat/assets/demo/target"
    plain = _run(tmp_path, ["draft"])[0]
    assert plain[plain.index("--stages") + 1] == "draft" and "--target-from" not in plain
    # the drafter's new tasks (unpacked with the data) are there for DRAFT_ARGS="--draft-novel SHARE"
    assert draft[draft.index("--draft-novel-tasks") + 1] == "/tmp/novel-proposals" and "--draft-novel" not in draft


def test_e2e_of_a_new_drafter_for_the_shipped_target_runs_the_shipped_drafter_beside_it(tmp_path):
    """TARGET_FROM=the shipped target: e2e times the new drafter and the shipped one on the same requests in the same
    call (the figures that decide whether the new one ships); another target: the new drafter alone."""
    def drafts(**env):
        runs = [c for c in _run(tmp_path, ["e2e"], **env) if "benchmarks/e2e.py" in c]
        return [(r[r.index("--target") + 1], r[r.index("--draft") + 1], r[r.index("--json") + 1]) for r in runs]

    shipped = drafts(TARGET_FROM="ddtree_chat/assets/demo/target")
    assert [d for _, d, _ in shipped] == ["/tmp/demo31/draft", "ddtree_chat/assets/demo/draft"]
    assert {t for t, _, _ in shipped} == {"ddtree_chat/assets/demo/target"}
    assert [Path(j).name for _, _, j in shipped] == ["e2e_demo_cuda.json", "e2e_shipped_cuda.json"]
    assert [d for _, d, _ in drafts()] == ["/tmp/demo31/draft"]


def test_pack_pair_leaves_out_a_target_that_is_not_this_runs(tmp_path):
    """With TARGET_FROM the drafter trains against that target: a demo31/target in /tmp is an older run's (one
    was once packed beside a new drafter as if it were its target), so the pair's archive leaves it out."""
    stub = tmp_path / "bin"
    stub.mkdir()
    packed = tmp_path / "packed.txt"
    (stub / "ls").write_text('#!/bin/sh\nshift\necho "$@"\n')  # NOTE: every path as if it existed
    (stub / "tar").write_text(f'#!/bin/sh\necho "$*" >> {packed}\n')
    for f in ("ls", "tar"):
        (stub / f).chmod(0o755)

    def archived(**env):
        packed.unlink(missing_ok=True)
        _run(tmp_path, ["pack-pair"], **env)
        return packed.read_text().split()

    assert "demo31/target" in archived() and "demo31/draft" in archived()
    new_drafter = archived(TARGET_FROM="ddtree_chat/assets/demo/target")
    assert "demo31/draft" in new_drafter and "demo31/target" not in new_drafter

