"""From CLI arguments to a ready-to-run app: settings, model paths, the engine factory."""

from __future__ import annotations

from pathlib import Path

from ddtree_chat import settings as settings_mod

# what a first chat on the shipped demo pair should know (README's demo paragraph says the same)
DEMO_INTRO = ("This is the built-in demo pair: a tiny (21 M-parameter) model in the Kimi K2.6 layout, taught to answer "
              "simple Python requests by a small instruction-tuned model, with its drafter "
              "(ddtree_chat/assets/README.md). It is here to show the engine and the live draft tree: its answers are "
              "often wrong. For real answers start with --model DIR --draft DIR (Kimi K2.6).")


def engine_factory(args):
    from ddtree_chat.bootstrap import load_engine

    return lambda progress: load_engine(args, progress)


def build_app(args):
    from ddtree_chat.ui.app import DDTreeChatApp

    try:
        settings, warning = settings_mod.load()
    except OSError as err:  # e.g. the config dir is a file or unwritable: defaults, and one line in the chat
        settings, warning = settings_mod.Settings(), f"Settings not loaded: {err.strerror or err} ({err.filename}); using defaults."
    warnings = [warning] if warning else []
    settings, problems = settings_mod.with_overrides(settings, args)
    warnings += problems
    from ddtree_chat.engine.default_model import random_fallback_note, shipped_demo_dirs

    model = getattr(args, "model", None)
    note = random_fallback_note(model)
    if note:
        warnings.append(note[0].upper() + note[1:] + ".")
    label = Path(model).name if model else "demo model"
    resume = getattr(args, "conversation", None) or ("latest" if getattr(args, "continue_", False) else None)
    intro = DEMO_INTRO if not model and shipped_demo_dirs() is not None else ""
    return DDTreeChatApp(engine_factory(args), settings, warnings=warnings, model_label=label, resume=resume,
                         intro=intro)
