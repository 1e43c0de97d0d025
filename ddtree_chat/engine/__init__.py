"""In-process inference engine. Never imports Textual."""

from .engine import Engine
from .errors import EngineError
from .generation import GenerationConfig

__all__ = ["Engine", "EngineError", "GenerationConfig"]
