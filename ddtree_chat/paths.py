"""Per-user directories (platformdirs), overridable with DDTREE_CHAT_HOME for tests and sandboxes."""

from __future__ import annotations

import os
from pathlib import Path

from . import knobs

_APP = "ddtree-chat"


class UserDirError(OSError):
    """A user dir cannot be created or written; str(err) is one sentence naming the path."""


def _base(kind: str) -> Path:
    home = knobs.get(knobs.CHAT_HOME)
    if home:
        path = Path(home) / kind
    else:
        try:
            import platformdirs
        except ImportError:  # NOTE: the GPU box has no platformdirs; engine-only runs still work.
            path = Path.home() / f".{_APP}" / kind
        else:
            path = Path(getattr(platformdirs, f"user_{kind}_dir")(_APP))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise _dir_error(kind, path, err) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise _dir_error(kind, path, PermissionError("permission denied"))
    return path


def _dir_error(kind: str, path: Path, err: OSError) -> UserDirError:
    if isinstance(err, (FileExistsError, NotADirectoryError)):
        why = "a file is in the way"
    else:
        why = (err.strerror or str(err)).lower()  # e.g. "permission denied", "read-only file system"
    hint = f" ({knobs.CHAT_HOME.name})" if knobs.get(knobs.CHAT_HOME) else ""
    return UserDirError(f"cannot use {path} as the {kind} directory{hint}: {why}")


def cache_dir() -> Path:
    return _base("cache")


def data_dir() -> Path:
    return _base("data")


def config_dir() -> Path:
    return _base("config")


def state_dir() -> Path:
    return _base("state")
