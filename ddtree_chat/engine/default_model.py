"""The model pair `ddtree-chat` loads when no --model is given.

Order: the shipped demo pair (issue 7), package data at ``ddtree_chat/assets/demo/`` (so a wheel carries it too);
otherwise a random tiny synthetic pair generated once into the cache dir (so an install without the weights still
starts, and says so: random_fallback_note).
"""

from __future__ import annotations

from pathlib import Path

DEMO_DIR = Path(__file__).resolve().parents[1] / "assets" / "demo"
RANDOM_FALLBACK_NOTE = ("the demo model is not installed (ddtree_chat/assets/demo is missing): using a tiny random "
                        "model instead, so the replies are gibberish")


def _is_target(d: Path) -> bool:
    return (d / "config.json").is_file() and (
        (d / "model.safetensors.index.json").is_file() or (d / "model.safetensors").is_file())


def _is_draft(d: Path) -> bool:
    return (d / "config.json").is_file() and (d / "model.safetensors").is_file()


def shipped_demo_dirs() -> tuple[Path, Path | None] | None:
    """(target_dir, draft_dir or None) of the shipped demo pair, or None when it is not present."""
    target, draft = DEMO_DIR / "target", DEMO_DIR / "draft"
    if _is_target(target):
        return target, (draft if _is_draft(draft) else None)
    return None


def random_fallback_note(model: str | None) -> str | None:
    """The warning to show (stderr, the TUI) when no --model is given and the random pair stands in for the demo."""
    return RANDOM_FALLBACK_NOTE if not model and shipped_demo_dirs() is None else None


def default_model_dirs() -> tuple[Path, Path | None]:
    """The shipped demo pair when present, else a synthetic tiny pair (random weights) in the cache dir."""
    found = shipped_demo_dirs()
    if found is not None:
        return found
    from .. import paths
    from .synthetic import make_synthetic_pair

    target, draft = make_synthetic_pair(paths.cache_dir() / "synthetic-tiny")
    return Path(target), Path(draft)


def resolve_model_dirs(model: str | None, draft: str | None) -> tuple[str, str | None]:
    """(target_dir, draft_dir) from --model/--draft; no --model means the default pair (its drafter
    unless --draft names another)."""
    if model:
        return str(Path(model).expanduser()), (str(Path(draft).expanduser()) if draft else None)
    target, default_draft = default_model_dirs()
    chosen = Path(draft).expanduser() if draft else default_draft
    return str(target), (str(chosen) if chosen else None)
