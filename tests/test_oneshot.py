"""One-shot output routing (answer to stdout, thinking to stderr) and the random-model warning."""

import argparse
import os
import subprocess
import sys

from ddtree_chat.oneshot import _restored, _show
from ddtree_chat.settings import Settings
from ddtree_chat.ui.thinking import ThinkSplitter


def _stream(chunks, show_thinking):
    splitter = ThinkSplitter(in_think=True)
    args = argparse.Namespace(json=False, show_thinking=show_thinking)
    for chunk in chunks:
        _show(splitter, chunk, args)
    _show(splitter, None, args)
    return splitter


def test_thinking_goes_to_stderr_only_when_asked(capsys):
    chunks = ["let me see", " </thi", "nk>\n\ndef f():", " pass", "<"]  # a tag split across rounds
    _stream(chunks, show_thinking=False)
    out, err = capsys.readouterr()
    assert out == "def f(): pass<" and err == ""
    _stream(chunks, show_thinking=True)
    out, err = capsys.readouterr()
    assert out == "def f(): pass<" and err == "let me see \n"


def test_a_continued_conversation_keeps_its_repeat_penalty():
    saved = Settings(repeat_penalty=1.2)
    assert _restored(saved, {"repeat_penalty": 1.5, "seed": 3}).repeat_penalty == 1.5
    assert _restored(saved, {"seed": 3}).repeat_penalty == 1.2, "one saved before the setting: the defaults' value"
    assert _restored(saved, {"repeat_penalty": 0.5}).repeat_penalty == 1.2, "a value no longer valid is skipped"


def test_random_fallback_is_said_on_stderr(tmp_path):
    # NOTE: the demo dir pointed elsewhere stands for an install without it
    code = ("import pathlib, sys; import ddtree_chat.engine.default_model as d; d.DEMO_DIR = pathlib.Path(sys.argv[1]); "
            "from ddtree_chat.cli import main; raise SystemExit(main(['--prompt', 'hi', '--max-new-tokens', '2', "
            "'--no-save', '--json', '--mode', 'ar']))")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "no-demo")], capture_output=True, text=True,
                       timeout=300, stdin=subprocess.DEVNULL, env=dict(os.environ, DDTREE_CHAT_HOME=str(tmp_path)))
    assert r.returncode == 0, r.stderr
    assert "demo model is not installed" in r.stderr and "gibberish" in r.stderr
    assert (tmp_path / "cache" / "synthetic-tiny").is_dir()
