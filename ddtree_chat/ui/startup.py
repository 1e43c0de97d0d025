"""From CLI arguments to a ready-to-run app: settings, model paths, the engine factory."""

from __future__ import annotations

import inspect
import logging
from pathlib import Path

from ddtree_chat import settings as settings_mod
from ddtree_chat.ui.loading import setup_logging

log = logging.getLogger("ddtree_chat.ui")


def resolve_model(args) -> tuple[str, str | None]:
    from ddtree_chat.engine.default_model import resolve_model_dirs

    return resolve_model_dirs(getattr(args, "model", None), getattr(args, "draft", None))


OPTIONAL_LOAD_ARGS = (("eager", "eager"), ("max_context", "context"), ("expert_parallel", "expert_parallel"),
                      ("dtype", "dtype"))


def engine_factory(args):
    def load(progress):
        from ddtree_chat.engine import Engine

        target, draft = resolve_model(args)
        kwargs = dict(draft_dir=draft, device=getattr(args, "device", None), tp=getattr(args, "tp", None), progress=progress)
        # NOTE: optional flags go only to an engine whose load() knows them, so the UI never breaks on them.
        known = inspect.signature(Engine.load).parameters
        for param, attr in OPTIONAL_LOAD_ARGS:
            if param in known and getattr(args, attr, None) is not None:
                kwargs[param] = getattr(args, attr)
        return Engine.load(target, **kwargs)

    return load


def build_app(args):
    from ddtree_chat.ui.app import DDTreeChatApp

    setup_logging()
    settings, warning = settings_mod.load()
    warnings = [warning] if warning else []
    settings, problems = settings_mod.with_overrides(settings, args)
    warnings += problems
    label = Path(args.model).name if getattr(args, "model", None) else "demo model"
    return DDTreeChatApp(engine_factory(args), settings, warnings=warnings, model_label=label)
