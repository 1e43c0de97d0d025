"""From CLI arguments to a ready-to-run app: settings, model paths, the engine factory."""

from __future__ import annotations

import inspect
import logging
from pathlib import Path

from ddtree_chat import settings as settings_mod
from ddtree_chat.ui.loading import setup_logging

log = logging.getLogger("ddtree_chat.ui")


def resolve_model(args) -> tuple[str, str | None]:
    """(target_dir, draft_dir); no --model means the demo pair shipped with the package."""
    if getattr(args, "model", None):
        return str(Path(args.model).expanduser()), (str(Path(args.draft).expanduser()) if getattr(args, "draft", None) else None)
    from ddtree_chat.engine.default_model import default_model_dirs

    target, draft = default_model_dirs()
    if getattr(args, "draft", None):
        draft = str(Path(args.draft).expanduser())
    return str(target), (str(draft) if draft else None)


OPTIONAL_LOAD_ARGS = (("eager", "eager"), ("max_context", "context"), ("expert_parallel", "expert_parallel"))


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
