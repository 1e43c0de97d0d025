"""ddtree-chat command line: the interactive TUI, or a one-shot reply (--prompt, or text piped to stdin).

One-shot mode never imports Textual: the answer streams to stdout, a stats line goes to stderr, and
--json prints one JSON event per line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import stat
import sys
import traceback

from . import __version__, knobs, logs
from . import settings as settings_mod
from .modes import BUDGETS, MAX_BUDGET, MAX_REPEAT_PENALTY, MODES, REPEAT_WINDOW

KEYS_HELP = """\
keys (interactive): Enter send, ctrl+j newline, Esc stop the reply, Up/Down earlier messages,
  PgUp/PgDn scroll, ctrl+r copy the reply, ctrl+b copy its code, ctrl+o conversations, ctrl+n new chat,
  ctrl+t tree panel, F2 draft-tree debug pane, ctrl+p command palette, ctrl+q quit; /help lists commands.

defaults: --model/--draft/--device/--context come from the flag, else the environment
  (DDTREE_CHAT_MODEL, DDTREE_CHAT_DRAFT), else the settings file (/save in the chat writes it)."""


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line (and a JSON error event under --json), never the usage block."""

    json_errors = False

    def error(self, message):
        _fail(f"{message} (ddtree-chat --help lists the options)", self.json_errors)
        raise SystemExit(2)


def _fail(message: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"event": "error", "message": message}, ensure_ascii=False), flush=True)
    print(f"ddtree-chat: {message}", file=sys.stderr, flush=True)


def _setting(name: str):
    """An argparse type that checks a value with the settings' rules (the TUI and the file use the same)."""
    def parse(text: str):
        try:
            return settings_mod.validate(name, text)
        except settings_mod.SettingsError as err:
            raise argparse.ArgumentTypeError(str(err).rstrip(".")) from None
    parse.__name__ = name  # argparse names the type in some messages
    return parse


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="ddtree-chat",
        description="Chat with Kimi K2.6 (or the built-in demo model) using DDTree speculative decoding. "
                    "With --prompt, or text piped to stdin, answer once and exit.",
        epilog=KEYS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    ap.add_argument("--model", metavar="DIR", help="target checkpoint directory (default: the built-in demo model)")
    ap.add_argument("--draft", metavar="DIR", help="DFlash drafter directory (default: the demo drafter with the demo model)")
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--prompt", metavar="TEXT",
                      help="one-shot: reply to TEXT and exit; text piped to stdin follows it ('-': stdin only)")
    what.add_argument("--list", action="store_true", help="list the saved conversations (newest first) and exit")
    what.add_argument("--search", metavar="TEXT",
                      help="list the saved conversations whose title or messages hold every word of TEXT, and exit "
                           "(exit status 1 when none does)")
    what.add_argument("--export", type=int, metavar="ID",
                      help="print conversation ID as Markdown (JSON with --json) and exit, e.g. > chat.md")
    ap.add_argument("--json", action="store_true",
                    help="one-shot: print one JSON event per line; --list/--search: one conversation per line; "
                         "--export: the conversation as JSON")
    ap.add_argument("--show-thinking", action="store_true", help="one-shot: print the model's thinking to stderr")
    ap.add_argument("-c", "--continue", dest="continue_", action="store_true",
                    help="continue the most recent conversation (one-shot or chat)")
    ap.add_argument("--conversation", type=int, metavar="ID", help="continue conversation ID (one-shot or chat; the chat's list shows the ids)")
    ap.add_argument("--no-save", dest="save", action="store_false",
                    help="one-shot: do not save the exchange as a conversation")
    ap.add_argument("--mode", choices=MODES, help="decoding mode (default: ddtree with a drafter, else ar)")
    ap.add_argument("--budget", type=_setting("budget"), metavar="N|auto",
                    help=f"draft tree nodes per round, root excluded, {BUDGETS.start}-{MAX_BUDGET} "
                         "(default auto: measured verify cost vs acceptance)")
    ap.add_argument("--temperature", type=_setting("temperature"), metavar="T",
                    help="sampling temperature, 0-5 (0 = greedy; default 0)")
    ap.add_argument("--top-p", type=_setting("top_p"), metavar="P", help="nucleus sampling mass, (0, 1] (default 1.0)")
    ap.add_argument("--repeat-penalty", type=_setting("repeat_penalty"), metavar="X",
                    help=f"make tokens among the last {REPEAT_WINDOW} less likely, "
                         f"1-{MAX_REPEAT_PENALTY:g} (default 1.0: off); lossless in every mode")
    ap.add_argument("--seed", type=_setting("seed"), metavar="S",
                    help="sampling seed, or random (default: a new one each reply, shown in the stats line at T > 0; "
                         "a seed gives the same reply in every mode)")
    ap.add_argument("--max-new-tokens", type=_setting("max_new_tokens"), metavar="N",
                    help="most tokens to generate per reply (default 512)")
    ap.add_argument("--tp", type=int, metavar="N",
                    help="tensor-parallel ranks (default: 1 when one GPU holds the model, else all visible GPUs; 1 on CPU)")
    ap.add_argument("--expert-parallel", action="store_true",
                    help="with --tp: split the routed experts across ranks instead of splitting each expert")
    ap.add_argument("--device", choices=settings_mod.DEVICES, help="where to run (default: cuda when available)")
    ap.add_argument("--system", metavar="TEXT", help="system prompt")
    ap.add_argument("--raw", action="store_true",
                    help="one-shot: tokenize the prompt as is, without the chat template (not saved)")
    ap.add_argument("--no-think", dest="thinking", action="store_false", help="open the reply with an empty <think></think>")
    ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                    help="compute precision (default auto: float32 on CPU and for small models on GPU; bf16 "
                         "otherwise. On the GPU the tree's tokens equal --mode ar's bit for bit in either (row-"
                         "invariant kernels); bf16 on the CPU may drift from --mode ar in long replies)")
    ap.add_argument("--context", type=_setting("context"), metavar="N",
                    help="context length to allocate (default: 4096 on CPU, 32768 on GPU)")
    ap.add_argument("--eager", action="store_true", help="disable CUDA graphs (GPU rounds then launch every kernel from Python)")
    ap.add_argument("--print-completion", choices=("bash", "zsh"), metavar="SHELL",
                    help="print a completion script for bash or zsh and exit (e.g. eval \"$(ddtree-chat "
                         "--print-completion bash)\")")
    return ap


_USES = {"state": "the log", "config": "the saved settings", "data": "saving conversations"}


def _unusable_dirs() -> set[str]:
    """The user dirs that cannot be written, said in one line (a file-blocked DDTREE_CHAT_HOME blocks them all)."""
    from . import paths

    errors = {}
    for kind in _USES:
        try:
            getattr(paths, f"{kind}_dir")()
        except OSError as err:
            errors[kind] = err
    if errors:
        print(f"ddtree-chat: {next(iter(errors.values()))}; running without "
              f"{', '.join(_USES[k] for k in errors)}.", file=sys.stderr)
    return set(errors)


def _load_saved() -> settings_mod.Settings:
    """The saved defaults; a broken file is a warning, never a stop."""
    saved, warning = settings_mod.load()
    if warning:
        print(f"ddtree-chat: {warning}", file=sys.stderr)
    return saved


def _piped_stdin() -> bool:
    """stdin is a pipe or a redirected file (a terminal, /dev/null or a socket is not read)."""
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISREG(mode)


def prompt_text(args) -> str | None:
    """The one-shot's user text (--prompt, then piped stdin), or None for the interactive chat."""
    if args.prompt == "-":
        return sys.stdin.read().rstrip("\n")
    piped = sys.stdin.read().rstrip("\n") if _piped_stdin() else ""
    if args.prompt is None:
        return piped if piped.strip() else None
    return f"{args.prompt}\n\n{piped}" if piped.strip() else args.prompt


def _archive(args) -> int:
    from .archive import ArchiveError, export_conversation, list_conversations

    try:
        if args.export is not None:
            return export_conversation(args.export, args.json)
        return list_conversations(args.search, args.json)
    except ArchiveError as e:
        _fail(str(e), args.json)
        return 1
    except BrokenPipeError:  # e.g. piped into `head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    parser.json_errors = "--json" in argv
    args = parser.parse_args(argv)
    if args.print_completion:
        from .completion import completion_script

        try:
            print(completion_script(parser, args.print_completion), flush=True)
        except BrokenPipeError:  # e.g. piped into `head`
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    if args.list or args.search is not None or args.export is not None:  # NOTE: the store alone, no model
        return _archive(args)
    bad_knobs = knobs.invalid()
    if bad_knobs:  # NOTE: a mistyped DDTREE_* value would otherwise be ignored without a word
        _fail("; ".join(bad_knobs), args.json)
        return 2
    unusable = _unusable_dirs()
    log_path = None
    if "state" not in unusable:
        log_warning = logs.setup_logging()
        if log_warning:
            print(f"ddtree-chat: {log_warning}", file=sys.stderr)
        else:
            log_path = str(logs.log_path())
    saved = _load_saved() if "config" not in unusable else settings_mod.Settings()
    if "data" in unusable:
        args.save = False
    vars(args).update(settings_mod.load_choice(args, saved))
    try:
        text = prompt_text(args)
    except KeyboardInterrupt:  # e.g. Ctrl+C while `--prompt -` waits for the terminal
        return 130
    if text is None:
        if not sys.stdin.isatty():
            _fail("nothing to answer: the prompt and stdin are empty (use --prompt TEXT, or pipe text in).", args.json)
            return 2
        from .ui.app import run_app

        return run_app(args)
    if not text.strip():  # NOTE: an empty turn would be answered for --max-new-tokens of nothing in particular
        _fail("nothing to answer: the prompt is empty (use --prompt TEXT, or pipe text in).", args.json)
        return 2
    from .engine.errors import EngineError
    from .oneshot import run_oneshot

    try:
        return run_oneshot(args, text, saved)
    except BrokenPipeError:  # e.g. piped into `head`
        sys.stderr.close()
        return 0
    except (EngineError, ValueError, OSError) as e:
        logging.getLogger("ddtree_chat").error("one-shot failed\n%s", traceback.format_exc())
        _fail(str(e), args.json)
        return 1
    except KeyboardInterrupt:  # before or after the reply (during it, the reply stops and run_oneshot returns)
        if args.json:
            print(json.dumps({"event": "done", "token_ids": [], "text": "", "stop_reason": "interrupted"}), flush=True)
        print("\nddtree-chat: interrupted.", file=sys.stderr)
        return 130
    except Exception as e:  # a bug: keep the user's terminal clean, keep the traceback in the log
        logging.getLogger("ddtree_chat").error("unexpected error\n%s", traceback.format_exc())
        where = f"; details in {log_path}" if log_path else ""
        _fail(f"internal error ({type(e).__name__}: {e}){where}", args.json)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
