"""Errors a user can cause. Each message is one readable sentence that says what to do."""


class EngineError(Exception):
    """Base class: str(err) is shown to the user as is (no traceback)."""


class ConfigError(EngineError):
    """config.json is missing, malformed or describes something we do not support."""


class CheckpointError(EngineError):
    """A shard, index or tensor is missing, corrupt, or has the wrong shape/dtype."""


class TokenizerError(EngineError):
    """The tokenizer files are missing or unreadable."""


class ContextLengthError(EngineError):
    """The prompt (plus what is asked to be generated) does not fit the context."""


class DeviceError(EngineError):
    """The requested device is unavailable or ran out of memory."""
