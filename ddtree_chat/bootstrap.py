"""From parsed arguments and settings to an engine and its generation config: shared by the one-shot
(oneshot.py) and the TUI's loading thread (ui/startup.py), so neither imports the other's front end."""

from __future__ import annotations

from .modes import Mode


def generation_config(settings, has_drafter: bool, mode_given: bool = True):
    """The engine's config for these settings; a saved mode the model cannot run falls back to ar."""
    from .engine import GenerationConfig

    mode = Mode(settings.mode or (Mode.DDTREE if has_drafter else Mode.AR))
    if mode is not Mode.AR and not has_drafter:
        if mode_given:
            raise ValueError(f"--mode {mode} needs a drafter; pass --draft DIR or use --mode ar.")
        mode = Mode.AR
    return GenerationConfig(mode=mode, budget=settings.budget, temperature=settings.temperature, top_p=settings.top_p,
                            repeat_penalty=settings.repeat_penalty, seed=settings.seed,
                            max_new_tokens=settings.max_new_tokens)


def load_engine(args, progress=None):
    """The engine the arguments ask for (model, draft, device, tp, context, dtype, --eager)."""
    from .engine import Engine
    from .engine.default_model import resolve_model_dirs

    model, draft = resolve_model_dirs(args.model, args.draft)
    return Engine.load(model, draft, device=args.device, tp=args.tp, max_context=args.context,
                       expert_parallel=args.expert_parallel, dtype=args.dtype, progress=progress,
                       graphs=not args.eager)
