"""One-shot mode: stdout/stderr/exit codes, stdin, --json schema, errors without tracebacks."""

import json
import os
import subprocess
import sys

import pytest


def run_cli(*args, stdin=None, env_home=None):
    env = dict(os.environ)
    if env_home:
        env["DDTREE_CHAT_HOME"] = str(env_home)
    return subprocess.run([sys.executable, "-m", "ddtree_chat.cli", *args], input=stdin, capture_output=True,
                          text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def model_args(synthetic_pair):
    target, draft = synthetic_pair
    return ["--model", str(target), "--draft", str(draft)]


def test_json_events_schema(model_args):
    r = run_cli(*model_args, "--prompt", "hello", "--mode", "ddtree", "--budget", "8", "--json", "--max-new-tokens", "12")
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    rounds, done = events[:-1], events[-1]
    assert rounds and all(e["event"] == "round" for e in rounds)
    for e in rounds[1:]:
        assert {"token_ids", "text", "tree", "accepted_length"} <= e.keys()
        assert {"tokens", "parents", "accepted_nodes"} <= e["tree"].keys()
        assert len(e["tree"]["tokens"]) == 9 and e["tree"]["accepted_nodes"][0] == 0
        assert e["accepted_length"] == len(e["token_ids"])
    assert done["event"] == "done"
    for key in ("token_ids", "text", "rounds", "target_forwards", "mean_accepted_length", "tokens_per_second", "stop_reason"):
        assert key in done
    assert done["token_ids"] == [t for e in rounds for t in e["token_ids"]]


@pytest.mark.parametrize("mode", ["ar", "dflash", "ddtree"])
def test_modes_stream_text_and_stats(model_args, mode):
    r = run_cli(*model_args, "--prompt", "hi", "--mode", mode, "--max-new-tokens", "10", "--raw")
    assert r.returncode == 0, r.stderr
    assert f"[{mode}]" in r.stderr and "tok/s" in r.stderr and "tokens/forward" in r.stderr
    assert "Traceback" not in r.stderr


def test_stdin_prompt(model_args):
    r = run_cli(*model_args, "--prompt", "-", "--max-new-tokens", "5", "--json", stdin="from stdin\n")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["event"] == "done"


def test_same_ids_across_modes(model_args):
    outs = []
    for mode in ("ar", "ddtree"):
        r = run_cli(*model_args, "--prompt", "same", "--mode", mode, "--max-new-tokens", "16", "--json")
        outs.append(json.loads(r.stdout.splitlines()[-1])["token_ids"])
    assert outs[0] == outs[1]


@pytest.mark.parametrize("args, needle", [
    (["--model", "/nonexistent/model", "--prompt", "hi"], "/nonexistent/model"),
    (["--prompt", "hi", "--budget", "-3"], "budget"),
])
def test_errors_are_one_line_and_nonzero(model_args, tmp_path, args, needle):
    full = args if args[0] == "--model" else model_args + args
    r = run_cli(*full, env_home=tmp_path)
    assert r.returncode != 0
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_help_documents_flags_and_keys():
    r = run_cli("--help")
    for flag in ("--model", "--draft", "--prompt", "--json", "--mode", "--budget", "--temperature", "--top-p",
                 "--seed", "--max-new-tokens", "--tp", "--device", "--system", "--raw", "Esc"):
        assert flag in r.stdout


def test_oneshot_never_imports_textual(model_args):
    code = ("import sys; from ddtree_chat.cli import main; "
            f"rc = main({model_args + ['--prompt', 'hi', '--max-new-tokens', '3', '--json']!r}); "
            "assert rc == 0 and not any(m == 'textual' or m.startswith('textual.') for m in sys.modules), 'textual'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-500:]
