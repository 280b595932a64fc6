"""The rollout engine: batched generation over a per-row KV cache."""

from bebop.engine.generate import generate
from bebop.engine.records import FINISH_CONTEXT, FINISH_LENGTH, FINISH_STOP, Generation

__all__ = ["FINISH_CONTEXT", "FINISH_LENGTH", "FINISH_STOP", "Generation", "generate"]
