"""From CLI arguments to a ready-to-run app: settings, model paths, the engine factory."""

from __future__ import annotations

import logging
from pathlib import Path

from ddtree_chat import settings as settings_mod
from ddtree_chat.ui.loading import setup_logging

log = logging.getLogger("ddtree_chat.ui")


def engine_factory(args):
    from ddtree_chat.cli import load_engine

    return lambda progress: load_engine(args, progress)


def build_app(args):
    from ddtree_chat.ui.app import DDTreeChatApp

    setup_logging()
    settings, warning = settings_mod.load()
    warnings = [warning] if warning else []
    settings, problems = settings_mod.with_overrides(settings, args)
    warnings += problems
    label = Path(args.model).name if getattr(args, "model", None) else "demo model"
    return DDTreeChatApp(engine_factory(args), settings, warnings=warnings, model_label=label)
