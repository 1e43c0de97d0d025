"""Per-user directories (platformdirs), overridable with DDTREE_CHAT_HOME for tests and sandboxes."""

from __future__ import annotations

import os
from pathlib import Path

_APP = "ddtree-chat"


def _base(kind: str) -> Path:
    home = os.environ.get("DDTREE_CHAT_HOME")
    if home:
        path = Path(home) / kind
    else:
        try:
            import platformdirs
        except ImportError:  # NOTE: the GPU box has no platformdirs; engine-only runs still work.
            path = Path.home() / f".{_APP}" / kind
        else:
            path = Path(getattr(platformdirs, f"user_{kind}_dir")(_APP))
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_dir() -> Path:
    return _base("cache")


def data_dir() -> Path:
    return _base("data")


def config_dir() -> Path:
    return _base("config")


def state_dir() -> Path:
    return _base("state")
