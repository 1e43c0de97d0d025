"""ddtree-chat command line: the interactive TUI, or one-shot generation with --prompt.

One-shot mode never imports Textual: text streams to stdout, a stats line goes to stderr, and
--json prints one JSON event per line."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import traceback

KEYS_HELP = """\
keys (interactive): Enter send, ctrl+j newline, Esc stop the reply, F2 draft-tree debug pane,
  ctrl+p command palette, ctrl+q quit; type /help in the input for slash commands."""


def _budget(text: str):
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', not {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="ddtree-chat",
        description="Chat with Kimi K2.6 (or the built-in demo model) using DDTree speculative decoding.",
        epilog=KEYS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", metavar="DIR", help="target checkpoint directory (default: the built-in demo model)")
    ap.add_argument("--draft", metavar="DIR", help="DFlash drafter directory (default: the demo drafter with the demo model)")
    ap.add_argument("--prompt", metavar="TEXT", help="one-shot: generate a reply to TEXT ('-' reads stdin) and exit")
    ap.add_argument("--json", action="store_true", help="one-shot: print one JSON event per line")
    ap.add_argument("--mode", choices=["ddtree", "dflash", "ar"], help="decoding mode (default: ddtree with a drafter, else ar)")
    ap.add_argument("--budget", type=_budget, metavar="N|auto",
                    help="draft tree nodes per round, root excluded (default auto: measured verify cost vs acceptance)")
    ap.add_argument("--temperature", type=float, metavar="T", help="sampling temperature (0 = greedy; default 0)")
    ap.add_argument("--top-p", type=float, metavar="P", help="nucleus sampling mass (default 1.0)")
    ap.add_argument("--seed", type=int, metavar="S", help="sampling seed (default 0)")
    ap.add_argument("--max-new-tokens", type=int, metavar="N", help="most tokens to generate per reply (default 512)")
    ap.add_argument("--tp", type=int, metavar="N",
                    help="tensor-parallel ranks (default: 1 when one GPU holds the model, else all visible GPUs; 1 on CPU)")
    ap.add_argument("--expert-parallel", action="store_true",
                    help="with --tp: split the routed experts across ranks instead of splitting each expert")
    ap.add_argument("--device", choices=["cpu", "cuda"], help="where to run (default: cuda when available)")
    ap.add_argument("--system", metavar="TEXT", help="system prompt")
    ap.add_argument("--raw", action="store_true", help="one-shot: tokenize the prompt as is, without the chat template")
    ap.add_argument("--no-think", dest="thinking", action="store_false", help="open the reply with an empty <think></think>")
    ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                    help="compute precision (default auto: float32 on CPU and for small models on GPU, where the "
                         "tree's tokens match --mode ar; bf16 otherwise: faster kernels, rounding may make long "
                         "replies drift from --mode ar)")
    ap.add_argument("--context", type=int, metavar="N", help="context length to allocate (default: 4096 on CPU, 32768 on GPU)")
    ap.add_argument("--eager", action="store_true", help="disable CUDA graphs (GPU rounds then launch every kernel from Python)")
    return ap


def _setup_log() -> str:
    from .paths import state_dir

    path = state_dir() / "ddtree-chat.log"
    logging.basicConfig(filename=path, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return str(path)


def generation_config(args, has_drafter: bool):
    from .engine import GenerationConfig

    mode = args.mode or ("ddtree" if has_drafter else "ar")
    if mode != "ar" and not has_drafter:
        raise ValueError(f"--mode {mode} needs a drafter; pass --draft DIR or use --mode ar.")
    fields = dict(mode=mode, budget=args.budget, temperature=args.temperature, top_p=args.top_p,
                  seed=args.seed, max_new_tokens=args.max_new_tokens)
    return GenerationConfig(**{k: v for k, v in fields.items() if v is not None})


def _prompt_ids(engine, args, text: str) -> list[int]:
    tok = engine.tokenizer
    if args.raw:
        return tok.encode(text)
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [{"role": "user", "content": text}]
    return tok.render_chat(messages, add_generation_prompt=True, thinking=args.thinking)


def load_engine(args, progress=None):
    """The engine the arguments ask for (one-shot mode and the TUI's loading thread both use this)."""
    from .engine import Engine
    from .engine.default_model import resolve_model_dirs

    model, draft = resolve_model_dirs(args.model, args.draft)
    return Engine.load(model, draft, device=args.device, tp=args.tp, max_context=args.context,
                       expert_parallel=args.expert_parallel, dtype=args.dtype, progress=progress,
                       graphs=not args.eager)


def run_oneshot(args) -> int:
    text = sys.stdin.read() if args.prompt == "-" else args.prompt
    engine = load_engine(args)
    cfg = generation_config(args, engine.drafter is not None)
    ids = _prompt_ids(engine, args, text)
    done = None
    for ev in engine.generate(ids, cfg):
        if args.json:
            print(json.dumps(ev, ensure_ascii=False), flush=True)
        elif ev["event"] == "round":
            sys.stdout.write(ev["text"])
            sys.stdout.flush()
        if ev["event"] == "done":
            done = ev
    if not args.json:
        sys.stdout.write(done["tail_text"] + "\n")
    print(f"[{done['mode']}] {len(done['token_ids'])} tokens in {done['elapsed_s']:.2f}s, "
          f"{done['tokens_per_second']:.1f} tok/s, {done['mean_accepted_length']:.2f} tokens/forward, "
          f"{done['rounds']} rounds, stop: {done['stop_reason']}", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    log_path = _setup_log()
    if args.prompt is None:
        if not sys.stdin.isatty() and not sys.stdout.isatty():
            print("ddtree-chat: no terminal; use --prompt TEXT (or --prompt - to read stdin).", file=sys.stderr)
            return 2
        from .ui.app import run_app

        return run_app(args)
    from .engine.errors import EngineError

    try:
        return run_oneshot(args)
    except (EngineError, ValueError, FileNotFoundError, PermissionError) as e:
        logging.getLogger("ddtree_chat").error("one-shot failed\n%s", traceback.format_exc())
        print(f"ddtree-chat: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. piped into `head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("\nddtree-chat: interrupted.", file=sys.stderr)
        return 130
    except Exception as e:  # a bug: keep the user's terminal clean, keep the traceback in the log
        logging.getLogger("ddtree_chat").error("unexpected error\n%s", traceback.format_exc())
        print(f"ddtree-chat: internal error ({type(e).__name__}: {e}); details in {log_path}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
