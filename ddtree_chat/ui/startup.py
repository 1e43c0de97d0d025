"""From CLI arguments to a ready-to-run app: settings, model paths, the engine factory."""

from __future__ import annotations

import inspect
import logging
from pathlib import Path

from ddtree_chat import settings as settings_mod
from ddtree_chat.settings import SettingsError
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


def engine_factory(args):
    def load(progress):
        from ddtree_chat.engine import Engine

        target, draft = resolve_model(args)
        kwargs = dict(draft_dir=draft, device=getattr(args, "device", None), tp=getattr(args, "tp", None), progress=progress)
        # NOTE: --eager is passed only to an engine that knows it, so the UI never breaks on it.
        if "eager" in inspect.signature(Engine.load).parameters:
            kwargs["eager"] = bool(getattr(args, "eager", False))
        return Engine.load(target, **kwargs)

    return load


def build_app(args):
    from ddtree_chat.ui.app import DDTreeChatApp

    setup_logging()
    settings, warning = settings_mod.load()
    warnings = [warning] if warning else []
    try:
        settings = settings_mod.with_overrides(settings, args)
    except SettingsError as err:
        warnings.append(f"{err} Ignoring that option.")
    label = Path(args.model).name if getattr(args, "model", None) else "demo model"
    return DDTreeChatApp(engine_factory(args), settings, warnings=warnings, model_label=label)
