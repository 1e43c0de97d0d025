"""User defaults for generation, persisted as JSON under the user config dir.

One place validates every value, so the file, the CLI, slash commands and the command
palette all agree on what is allowed. A corrupt or invalid file never stops the program:
the bad parts are reported as a warning and the defaults are used instead.

The model to load (model, draft, device, context) is saved here too; for those, a flag wins over
the environment (DDTREE_CHAT_MODEL, DDTREE_CHAT_DRAFT), which wins over this file (load_choice).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from dataclasses import dataclass, fields
from pathlib import Path

from ddtree_chat import knobs, paths
from ddtree_chat.modes import BUDGETS, MAX_REPEAT_PENALTY, MODES

MAX_CONTEXT = 1 << 20  # far above any model's positions; only catches typos
DEVICES = ("cpu", "cuda")
SETTINGS_FILE = "settings.json"
ENV_MODEL, ENV_DRAFT = knobs.CHAT_MODEL.name, knobs.CHAT_DRAFT.name
RANDOM_SEED = "random"  # the seed setting that draws a new seed for each reply (as llama.cpp and ollama do)


class SettingsError(ValueError):
    """A value a user gave is not allowed; str(err) says what is."""


@dataclass(frozen=True)
class Settings:
    system: str = ""
    temperature: float = 0.0
    top_p: float = 1.0
    repeat_penalty: float = 1.0  # 1: off
    max_new_tokens: int = 512
    mode: str | None = None  # None: ddtree when a drafter exists, else ar
    budget: int | str = "auto"  # drafted nodes per round, or auto (measured cost vs acceptance)
    thinking: bool = True
    seed: int | str = RANDOM_SEED  # a number: the same samples for the same conversation; "random": a new one each reply
    model: str | None = None  # None: the built-in demo pair
    draft: str | None = None  # the drafter saved with `model`
    device: str | None = None  # None: cuda when available
    context: int | None = None  # None: the engine's default for the device

    def replace(self, **changes) -> "Settings":
        return dataclasses.replace(self, **changes)


_ON = {"on", "true", "yes", "1"}
_OFF = {"off", "false", "no", "0"}


def _to_bool(name: str, value) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _ON:
        return True
    if text in _OFF:
        return False
    raise SettingsError(f"{name} must be on or off, not {value!r}.")


def _to_number(name: str, value, kind, lo, hi):
    try:
        if isinstance(value, bool):
            raise ValueError
        number = kind(value) if kind is float else int(str(value).strip())
    except (TypeError, ValueError):
        raise SettingsError(f"{name} must be a number between {lo} and {hi}, not {value!r}.") from None
    if number != number or not lo <= number <= hi:  # NaN fails the first test
        raise SettingsError(f"{name} must be between {lo} and {hi}, not {value!r}.")
    return number


def validate(name: str, value):
    """Return `value` converted to the type of setting `name`, or raise SettingsError."""
    if name == "system":
        if value is None:
            return ""
        if not isinstance(value, str):
            raise SettingsError("system must be text.")
        return value
    if name == "temperature":
        return _to_number(name, value, float, 0.0, 5.0)
    if name == "top_p":
        number = _to_number(name, value, float, 0.0, 1.0)
        if number == 0.0:
            raise SettingsError(f"top_p must be greater than 0 and at most 1, not {value!r}.")
        return number
    if name == "repeat_penalty":
        try:
            return _to_number(name, value, float, 1.0, MAX_REPEAT_PENALTY)
        except SettingsError:  # one wording for every bad value, the engine's
            raise SettingsError(f"repeat_penalty must be from 1 to {MAX_REPEAT_PENALTY:g}, not {value!r}.") from None
    if name == "max_new_tokens":
        return _to_number(name, value, int, 1, 1_000_000)
    if name == "budget":
        if str(value).strip().lower() == "auto":
            return "auto"
        return _to_number(name, value, int, BUDGETS.start, BUDGETS.stop - 1)
    if name == "seed":
        if str(value).strip().lower() == RANDOM_SEED:
            return RANDOM_SEED
        try:
            return _to_number(name, value, int, 0, 2**63 - 1)
        except SettingsError:
            raise SettingsError(f"seed must be a number from 0 to {2**63 - 1} or random, not {value!r}.") from None
    if name == "thinking":
        return _to_bool(name, value)
    if name in ("model", "draft"):
        if value is None or (isinstance(value, str) and value.strip()):
            return value
        raise SettingsError(f"{name} must be a directory path, not {value!r}.")
    if name == "device":
        if value is None or value in DEVICES:
            return value
        raise SettingsError(f"device must be one of {', '.join(DEVICES)}, not {value!r}.")
    if name == "context":
        return None if value is None else _to_number(name, value, int, 1, MAX_CONTEXT)
    if name == "mode":
        if value is None:
            return None
        text = str(value).strip().lower()
        if text not in MODES:
            raise SettingsError(f"mode must be one of {', '.join(MODES)}, not {value!r}.")
        return text
    raise SettingsError(f"Unknown setting {name!r}.")


FIELD_NAMES = tuple(f.name for f in fields(Settings))


def with_seed(settings: Settings) -> Settings:
    """The settings of one reply: a random seed drawn (0 .. 2**31 - 1), a number kept. The reply's seed is kept with
    it (and shown at T > 0), so --seed repeats it."""
    return settings.replace(seed=random.randrange(2**31)) if settings.seed == RANDOM_SEED else settings


def settings_path() -> Path:
    return paths.config_dir() / SETTINGS_FILE


def from_dict(data: dict) -> tuple[Settings, list[str]]:
    """Build Settings from a mapping; unknown keys and bad values become warnings."""
    warnings: list[str] = []
    values = {}
    for key, value in data.items():
        if key not in FIELD_NAMES:
            warnings.append(f"ignored unknown setting {key!r}")
            continue
        try:
            values[key] = validate(key, value)
        except SettingsError as err:
            warnings.append(f"{err} Using the default.")
    return Settings(**values), warnings


def load(path: Path | None = None) -> tuple[Settings, str | None]:
    """Return (settings, warning). A missing file is not a warning; a broken one is."""
    path = path or settings_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Settings(), None
    except OSError as err:
        return Settings(), f"Could not read settings file {path} ({err.strerror}); using defaults."
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not an object")
    except ValueError:
        return Settings(), f"Settings file {path} is not valid JSON; using defaults (fix or delete it)."
    settings, problems = from_dict(data)
    if problems:
        return settings, f"Settings file {path}: " + "; ".join(problems)
    return settings, None


def save(settings: Settings, path: Path | None = None) -> Path:
    """Write atomically (temp file + rename), so a crash never leaves half a file."""
    path = path or settings_path()
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(settings), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def load_choice(args, saved: Settings, environ=None) -> dict:
    """model, draft, device and context for this run: a flag, else the environment, else the settings file.

    The drafter goes with its model: --draft, else the one from the source that named the model."""
    environ = os.environ if environ is None else environ
    if args.model:
        model, draft = args.model, args.draft
    elif environ.get(ENV_MODEL):
        model, draft = environ[ENV_MODEL], args.draft or environ.get(ENV_DRAFT) or None
    elif saved.model:
        model, draft = saved.model, args.draft or saved.draft
    else:
        model, draft = None, args.draft
    return dict(model=model, draft=draft, device=args.device or saved.device,
                context=args.context if args.context is not None else saved.context)


def with_overrides(settings: Settings, args) -> tuple[Settings, list[str]]:
    """Apply CLI values (argparse Namespace; None means "not given") for this run only.

    Returns the settings and one warning per rejected value (the others still apply).
    """
    changes, warnings = {}, []
    for name in FIELD_NAMES:
        value = getattr(args, name, None)
        # NOTE: the CLI only has --no-think (thinking defaults to True there), so True means "not given".
        if value is None or (name == "thinking" and value is True):
            continue
        try:
            changes[name] = validate(name, value)
        except SettingsError as err:
            warnings.append(f"{err} Ignoring that option.")
    return settings.replace(**changes), warnings
