"""Sampling parameters, validated once at the boundary."""

from __future__ import annotations

from dataclasses import dataclass

from bebop.errors import BebopError


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k 0 means off; top_p 1.0 means off."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:  # also rejects NaN
            raise BebopError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise BebopError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise BebopError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
