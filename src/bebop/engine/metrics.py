"""Speculative-decoding metrics with vLLM's names and definitions.

    num_drafts                  verification steps that carried drafts (one per row per step)
    num_draft_tokens            drafted tokens (K per draft)
    num_accepted_tokens         drafts accepted by the acceptance rule
    acceptance_rate             num_accepted_tokens / num_draft_tokens
    mean_acceptance_length      1 + num_accepted_tokens / num_drafts  (tokens per target forward, max K+1)
    acceptance_rate_per_position[d-1]   drafts accepted at depth d / num_drafts
    mean_entropy                mean target entropy of the emitted policy tokens (nats)
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecMetrics:
    k: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    entropy_sum: float = 0.0
    num_emitted: int = 0

    def __post_init__(self) -> None:
        if not self.accepted_per_position:
            self.accepted_per_position = [0] * self.k

    def record_draft(self, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += self.k
        self.num_accepted_tokens += num_accepted
        for d in range(num_accepted):
            self.accepted_per_position[d] += 1

    def record_emitted(self, entropies: list[float]) -> None:
        self.entropy_sum += sum(entropies)
        self.num_emitted += len(entropies)

    def merge(self, other: "SpecMetrics") -> "SpecMetrics":
        if other.k != self.k:
            raise ValueError(f"cannot merge metrics for K={self.k} and K={other.k}")
        return SpecMetrics(self.k, self.num_drafts + other.num_drafts, self.num_draft_tokens + other.num_draft_tokens,
                           self.num_accepted_tokens + other.num_accepted_tokens,
                           [a + b for a, b in zip(self.accepted_per_position, other.accepted_per_position)],
                           self.entropy_sum + other.entropy_sum, self.num_emitted + other.num_emitted)

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        return [a / self.num_drafts if self.num_drafts else 0.0 for a in self.accepted_per_position]

    @property
    def mean_entropy(self) -> float:
        return self.entropy_sum / self.num_emitted if self.num_emitted else 0.0

    def to_dict(self) -> dict:
        return {"k": self.k, "num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
                "num_accepted_tokens": self.num_accepted_tokens, "acceptance_rate": self.acceptance_rate,
                "mean_acceptance_length": self.mean_acceptance_length,
                "acceptance_rate_per_position": self.acceptance_rate_per_position, "mean_entropy": self.mean_entropy}
