"""One-shot mode: stdout/stderr/exit codes, stdin, --json schema, errors without tracebacks."""

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys

import pytest


def run_cli(*args, stdin=None, home=None, env=None):
    """Run the CLI in a fresh process; stdin is /dev/null unless text is given (never the test runner's)."""
    full_env = dict(os.environ, **(env or {}))
    if home is not None:
        full_env["DDTREE_CHAT_HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "ddtree_chat.cli", *args], input=stdin, capture_output=True,
                          text=True, timeout=300, env=full_env, stdin=subprocess.DEVNULL if stdin is None else None)


@pytest.fixture(scope="module")
def model_args(synthetic_pair):
    target, draft = synthetic_pair
    return ["--model", str(target), "--draft", str(draft)]


def test_json_events_schema(model_args, tmp_path):
    r = run_cli(*model_args, "--prompt", "hello", "--mode", "ddtree", "--budget", "8", "--json", "--max-new-tokens", "12",
                home=tmp_path)
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
    assert done["prompt_tokens"] > 1 and 0 < done["prompt_s"] < done["elapsed_s"] and done["load_s"] > 0
    assert isinstance(done["seed"], int)  # the reply's own (drawn: no --seed)


@pytest.mark.parametrize("mode", ["ar", "dflash", "ddtree"])
def test_modes_stream_text_and_stats(model_args, mode, tmp_path):
    r = run_cli(*model_args, "--prompt", "hi", "--mode", mode, "--max-new-tokens", "10", "--raw", home=tmp_path)
    assert r.returncode == 0, r.stderr
    stats = r.stderr.strip().splitlines()[-1]
    assert re.match(rf"\[{mode}\] prompt \d+ tokens in [0-9.]+s \([0-9.]+ tok/s\) · reply 10 tokens in ", stats), stats
    assert "tokens/forward" in stats
    assert "load " in stats and "Traceback" not in r.stderr


def test_stdin_prompt(model_args, tmp_path):
    r = run_cli(*model_args, "--prompt", "-", "--max-new-tokens", "5", "--json", stdin="from stdin\n", home=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["event"] == "done"


def test_same_ids_across_modes(model_args, tmp_path):
    outs = []
    for mode in ("ar", "ddtree"):
        r = run_cli(*model_args, "--prompt", "same", "--mode", mode, "--max-new-tokens", "16", "--json", home=tmp_path)
        outs.append(json.loads(r.stdout.splitlines()[-1])["token_ids"])
    assert outs[0] == outs[1]


@pytest.mark.parametrize("args, needle", [
    (["--model", "/nonexistent/model", "--prompt", "hi"], "/nonexistent/model"),
    (["--model", "/nonexistent/model", "--prompt", "hi", "--json"], "/nonexistent/model"),
    (["--prompt", "hi", "--budget", "-3"], "'-3'"),
    (["--prompt", "hi", "--budget", "0"], "--budget: budget must be between 1 and 1023, not '0'"),
    (["--prompt", "hi", "--context", "0"], "--context: context must be between 1 and"),
    (["--prompt", "hi", "--context", "-5"], "'-5'"),
    (["--prompt", "hi", "--temperature", "nan"], "--temperature: temperature must be between 0.0 and 5.0, not 'nan'"),
    (["--prompt", "hi", "--top-p", "0", "--json"], "--top-p: top_p must be greater than 0"),
    (["--prompt", "hi", "--top-p", "1.5"], "--top-p: top_p must be between 0.0 and 1.0, not '1.5'"),
    (["--prompt", "hi", "--repeat-penalty", "11", "--json"], "--repeat-penalty: repeat_penalty must be from 1 to 10, not '11'"),
    (["--prompt", "hi", "--conversation", "99"], "no conversation 99"),
    ([], "nothing to answer"),  # stdin is /dev/null: neither a terminal nor a pipe
    (["--prompt", "  "], "nothing to answer: the prompt is empty"),
])
def test_errors_are_one_line_and_nonzero(model_args, tmp_path, args, needle):
    full = args if not args or args[0] == "--model" else model_args + args
    r = run_cli(*full, home=tmp_path)
    assert r.returncode != 0
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    if "--json" in args:
        event = json.loads(r.stdout)
        assert event["event"] == "error" and needle in event["message"]
    else:
        assert r.stdout == ""


def test_help_version_and_flags():
    r = run_cli("--help")
    for flag in ("--model", "--draft", "--prompt", "--json", "--mode", "--budget", "--temperature", "--top-p",
                 "--repeat-penalty", "--seed", "--max-new-tokens", "--tp", "--device", "--system", "--raw", "--show-thinking", "--continue",
                 "--conversation", "--no-save", "--print-completion", "--list", "--search", "--export", "DDTREE_CHAT_MODEL", "Esc"):
        assert flag in r.stdout
    from ddtree_chat import __version__

    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"ddtree-chat {__version__}"


def test_oneshot_never_imports_textual(model_args, tmp_path):
    code = ("import sys; from ddtree_chat.cli import main; "
            f"rc = main({model_args + ['--prompt', 'hi', '--max-new-tokens', '3', '--json']!r}); "
            "assert rc == 0 and not any(m == 'textual' or m.startswith('textual.') for m in sys.modules), 'textual'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       stdin=subprocess.DEVNULL, env=dict(os.environ, DDTREE_CHAT_HOME=str(tmp_path)))
    assert r.returncode == 0, r.stderr[-500:]


def _conversations(home):
    with sqlite3.connect(home / "data" / "history.sqlite3") as db:
        ids = [i for (i,) in db.execute("SELECT id FROM conversations ORDER BY id")]
        return {i: db.execute("SELECT role, content FROM messages WHERE conversation_id = ? ORDER BY id", (i,)).fetchall()
                for i in ids}


def test_demo_answer_only_piped_stdin_and_saved_conversations(tmp_path):
    """The demo pair (the default model): stdout is the answer without think tags; a piped file follows
    --prompt; -c continues the saved exchange; piped text alone is a one-shot (not the TUI); a continued
    conversation drops its oldest turns to fit --context."""
    r = run_cli("--prompt", "Write a function that reverses a list", "--max-new-tokens", "16", "--show-thinking",
                home=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() and "<think>" not in r.stdout and "</think>" not in r.stdout
    assert "demo model is not installed" not in r.stderr
    first = _conversations(tmp_path)
    assert [role for role, _ in first[1]] == ["user", "assistant"] and first[1][1][1] == r.stdout.strip()

    r = run_cli("--prompt", "explain this", "-c", "--max-new-tokens", "8", "--json", "--budget", "16", stdin="def f(x):\n    return x\n",
                home=tmp_path)
    assert r.returncode == 0, r.stderr
    saved = _conversations(tmp_path)
    assert list(saved) == [1] and saved[1][2] == ("user", "explain this\n\ndef f(x):\n    return x")
    assert saved[1][3][0] == "assistant" and len(saved[1]) == 4
    done = json.loads(r.stdout.splitlines()[-1])
    assert done["prompt_tokens"] > 20  # the first exchange is part of the prompt

    r = run_cli("--max-new-tokens", "4", "--no-save", "--conversation", "1", "--budget", "16", stdin="only piped text\n", home=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() and len(_conversations(tmp_path)[1]) == 4

    # a conversation longer than the context loses its oldest turns instead of failing
    r = run_cli("--prompt", "shorter?", "-c", "--context", "48", "--max-new-tokens", "4", "--json", "--budget", "16",
                home=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "oldest messages of this conversation to fit the context (48 tokens)" in r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["prompt_tokens"] <= 44 and len(_conversations(tmp_path)[1]) == 6


def test_ctrl_c_under_json_ends_with_an_interrupted_done_event(model_args, tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "ddtree_chat.cli", *model_args, "--prompt", "hi", "--json",
                          "--max-new-tokens", "100000", "--context", "100000", "--no-save"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, DDTREE_CHAT_HOME=str(tmp_path)))
    first = json.loads(p.stdout.readline())  # the reply is under way
    p.send_signal(signal.SIGINT)
    # NOTE: read on through p.stdout: readline may have buffered more lines, which communicate() (reading the
    # pipe's descriptor) would skip; stderr holds a few lines only, so reading it second cannot block the child
    out, err = p.stdout.read(), p.stderr.read()
    p.wait(timeout=120)
    events = [first] + [json.loads(line) for line in out.splitlines()]
    assert p.returncode == 130 and "Traceback" not in err
    assert events[-1]["event"] == "done" and events[-1]["stop_reason"] == "interrupted"
    assert events[-1]["token_ids"] == [t for e in events[:-1] for t in e["token_ids"]]


def test_blocked_user_dirs_are_one_line_and_the_reply_still_comes(model_args, tmp_path):
    blocker = tmp_path / "home-is-a-file"
    blocker.write_text("")
    r = run_cli(*model_args, "--prompt", "hi", "--max-new-tokens", "4", "--json", "--budget", "8", home=blocker)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["event"] == "done"
    notes = [line for line in r.stderr.splitlines() if not line.startswith("[")]
    assert len(notes) == 1 and str(blocker) in notes[0] and "running without" in notes[0]


def test_saved_model_defaults_env_over_settings(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "settings.json").write_text(json.dumps({"model": "/nonexistent/saved-model"}))
    r = run_cli("--prompt", "hi", home=tmp_path)
    assert r.returncode == 1 and "/nonexistent/saved-model" in r.stderr
    r = run_cli("--prompt", "hi", home=tmp_path, env={"DDTREE_CHAT_MODEL": "/nonexistent/env-model"})
    assert r.returncode == 1 and "/nonexistent/env-model" in r.stderr  # the flag over both: test_settings


def test_completion_scripts_follow_the_parser(tmp_path):
    from ddtree_chat.cli import build_parser

    bash = run_cli("--print-completion", "bash").stdout
    (tmp_path / "models" / "kimi").mkdir(parents=True)
    probe = (f'{bash}\ncomplete_at() {{ COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _ddtree_chat; echo "${{COMPREPLY[*]}}"; }}\n'
             f'complete_at ddtree-chat --mo\ncomplete_at ddtree-chat --mode d\ncd {tmp_path}\n'
             'complete_at ddtree-chat --draft models/k\ncomplete_at ddtree-chat --prompt x\ncomplete_at ddtree-chat --rep')
    lines = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=60).stdout.splitlines()
    assert lines == ["--model --mode", "ddtree dflash", "models/kimi", "", "--repeat-penalty"]

    zsh = run_cli("--print-completion", "zsh").stdout
    assert zsh.startswith("#compdef ddtree-chat") and "compdef _ddtree_chat ddtree-chat" in zsh
    for action in build_parser()._actions:
        for name in action.option_strings:
            assert f"'{name}[" in zsh
    assert ":mode:(ddtree dflash ar)'" in zsh and "'--model[" in zsh and ":DIR:_files -/'" in zsh


def _config_runs(model_args, home, *args):
    """Run the one-shot in a fresh process; the GenerationConfig it built, as printed to stderr."""
    code = ("import sys; import ddtree_chat.bootstrap as b; built = b.generation_config\n"
            "def seen(*a, **k):\n    cfg = built(*a, **k); print('CONFIG', cfg.repeat_penalty, file=sys.stderr); return cfg\n"
            "b.generation_config = seen; from ddtree_chat.cli import main; raise SystemExit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", code, *model_args, "--prompt", "hi", "--max-new-tokens", "2", "--json",
                        "--mode", "ar", *args], capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                       env=dict(os.environ, DDTREE_CHAT_HOME=str(home)))
    assert r.returncode == 0, r.stderr
    return float(next(line.split()[1] for line in r.stderr.splitlines() if line.startswith("CONFIG ")))


def test_repeat_penalty_flag_reaches_the_config_and_stays_with_the_conversation(model_args, tmp_path):
    assert _config_runs(model_args, tmp_path) == 1.0
    assert _config_runs(model_args, tmp_path, "--repeat-penalty", "1.3") == 1.3
    with sqlite3.connect(tmp_path / "data" / "history.sqlite3") as db:
        stored = [json.loads(s) for (s,) in db.execute("SELECT settings FROM conversations ORDER BY id")]
    assert [s["repeat_penalty"] for s in stored] == [1.0, 1.3]
    assert _config_runs(model_args, tmp_path, "-c") == 1.3, "a continued conversation keeps its penalty"
    assert _config_runs(model_args, tmp_path, "-c", "--repeat-penalty", "2") == 2.0, "a flag wins over it"
    with sqlite3.connect(tmp_path / "data" / "history.sqlite3") as db:  # a conversation saved before the setting
        db.execute("UPDATE conversations SET settings = '{\"seed\": 4}' WHERE id = 2")
    assert _config_runs(model_args, tmp_path, "--conversation", "2") == 1.0
    r = run_cli(*model_args, "--prompt", "hi", "--repeat-penalty", "0.5", home=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == ("ddtree-chat: argument --repeat-penalty: repeat_penalty must be from 1 to 10, not '0.5' "
                        "(ddtree-chat --help lists the options)\n")


def test_a_knob_value_outside_its_choices_is_one_line(tmp_path):
    """A mistyped DDTREE_* value stops the start with one line naming it and what it takes (TUI and one-shot
    alike: the check runs before either), instead of being ignored."""
    r = run_cli("--prompt", "hi", home=tmp_path, env={"DDTREE_MLA": "cudaa", "DDTREE_EXACT": ""})
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "DDTREE_MLA='cudaa'" in lines[0] and "triton, cuda, cuda-wide" in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_knob_choices():
    from ddtree_chat import knobs

    assert knobs.invalid({"DDTREE_MLA": "cuda", "DDTREE_EXACT": "0", "DDTREE_CHAT_MODEL": "anything"}) == []
    assert knobs.invalid({"DDTREE_MLA": "cuda-wide"}) == []
    assert knobs.invalid({"DDTREE_EXACT": ""}) == []  # empty: unset
    bad = knobs.invalid({"DDTREE_EXACT": "yes", "DDTREE_TP_COLLECTIVES": "mpi"})
    assert bad == ["DDTREE_TP_COLLECTIVES='mpi' is not one of auto, nccl", "DDTREE_EXACT='yes' is not one of 0, 1"]
    assert all(k.default in k.choices for k in knobs.KNOBS if k.choices and k.default is not None)



def test_list_search_and_export_read_the_saved_conversations_without_a_model(tmp_path, monkeypatch):
    """--list / --search / --export: the store alone (no model is loaded: no --model here), tables or JSON lines,
    grep's exit status for a search, one line for a missing id, and no database made by a look at an empty home."""
    r = run_cli("--list", home=tmp_path)
    assert r.returncode == 0 and r.stdout == "" and "no saved conversations yet" in r.stderr
    assert not any(tmp_path.rglob("*.sqlite3"))
    monkeypatch.setenv("DDTREE_CHAT_HOME", str(tmp_path))
    from ddtree_chat.history import History

    history = History.open()
    first = history.new_conversation("palindromes", {"mode": None, "temperature": 0.0})
    history.add_message(first, "user", "Write is_palindrome(s)")
    history.add_message(first, "assistant", "```python\ndef is_palindrome(s):\n    return s == s[::-1]\n```")
    second = history.new_conversation("capitals")
    history.add_message(second, "user", "What is the capital of France?")
    history.close()
    r = run_cli("--list", home=tmp_path)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and lines[0].split() == ["id", "updated", "messages", "title"]
    assert [line.split()[0] for line in lines[1:]] == [str(second), str(first)]  # newest first
    rows = [json.loads(line) for line in run_cli("--list", "--json", home=tmp_path).stdout.splitlines()]
    assert [(c["id"], c["title"], c["messages"]) for c in rows] == [(second, "capitals", 1), (first, "palindromes", 2)]
    r = run_cli("--search", "France", home=tmp_path)
    assert r.returncode == 0 and "capitals" in r.stdout and "palindromes" not in r.stdout and "France" in r.stdout
    r = run_cli("--search", "zebra", home=tmp_path)
    assert r.returncode == 1 and r.stdout == "" and "no saved conversation matches 'zebra'" in r.stderr
    md = run_cli("--export", str(first), home=tmp_path).stdout
    assert md.startswith("# palindromes") and "```python\ndef is_palindrome(s):" in md and "None" not in md
    data = json.loads(run_cli("--export", str(first), "--json", home=tmp_path).stdout)
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"] and data["title"] == "palindromes"
    r = run_cli("--export", "99", home=tmp_path)
    assert r.returncode == 1 and r.stderr.strip() == "ddtree-chat: there is no conversation 99 (ddtree-chat --list shows the ids)."
    r = run_cli("--list", "--prompt", "hi", home=tmp_path)
    assert r.returncode == 2 and "not allowed with" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    code = (f"import sys; from ddtree_chat.cli import main; assert main(['--export', '{first}']) == 0; "
            "assert not any(m == 'textual' or m.startswith('textual.') for m in sys.modules), 'textual'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL, env=dict(os.environ, DDTREE_CHAT_HOME=str(tmp_path)))
    assert r.returncode == 0, r.stderr[-500:]


def test_sampled_replies_draw_a_new_seed_each_time_and_the_shown_seed_repeats_one(model_args, tmp_path):
    """At T > 0 without --seed each reply draws its own seed (as llama.cpp and ollama do) and the stats line shows
    it; --seed with that number gives the same reply again, in another mode too (each draw is keyed by position)."""
    sampled = ("--prompt", "hello", "--temperature", "1.5", "--max-new-tokens", "24", "--no-save", "--mode", "ar")
    runs = [run_cli(*model_args, *sampled, home=tmp_path) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr
    seeds = [int(re.search(r" · seed (\d+)$", r.stderr.strip().splitlines()[-1]).group(1)) for r in runs]
    assert seeds[0] != seeds[1]
    again = run_cli(*model_args, *sampled[:-1], "ddtree", "--seed", str(seeds[0]), home=tmp_path)
    assert again.returncode == 0 and again.stdout == runs[0].stdout
    assert again.stderr.strip().endswith(f"seed {seeds[0]}")
    greedy = run_cli(*model_args, "--prompt", "hello", "--max-new-tokens", "4", "--no-save", home=tmp_path)
    assert "seed" not in greedy.stderr.strip().splitlines()[-1], "at T = 0 no seed matters"
