"""Typed records between the RL stages: one `Rollout` per sample, one `RolloutBatch` per step."""

from __future__ import annotations

from dataclasses import dataclass, field

from bebop.engine.metrics import SpecMetrics


@dataclass
class Rollout:
    prompt_ids: list[int]
    token_ids: list[int]  # every new token: stop token and environment observations included
    sampler_logprobs: list[float]  # per token: the sampler's log-prob at its temperature (0.0 for env tokens)
    policy_mask: list[bool]  # per token: False where the environment wrote it (never trained on)
    reward: float
    policy_version: int  # the weights that sampled it
    truncated: bool = False  # cut by max_new_tokens (or the context) before a stop token
    target_forwards: int = 0  # target forwards that emitted its tokens (speculative: fewer than its tokens)
    drafts_by_source: dict[str, list[int]] = field(default_factory=dict)  # drafter -> [drafts, accepted tokens]

    @property
    def acceptance_length(self) -> float | None:
        """Policy tokens per target forward (1.0 without drafting); None when nothing was emitted."""
        return self.num_policy_tokens / self.target_forwards if self.target_forwards else None

    @property
    def num_policy_tokens(self) -> int:
        return sum(self.policy_mask)


@dataclass
class RolloutBatch:
    """batch_prompts groups of group_size rollouts, group-major: rows g*G .. g*G+G-1 share a prompt."""

    rollouts: list[Rollout]
    group_size: int
    policy_version: int
    index: int  # data position: which batch of the run's prompt stream
    rollout_s: float  # seconds the engine spent on it
    spec: SpecMetrics | None  # acceptance metrics when drafting, else None
    pass_rate: float
    entropy: float | None  # mean sampler entropy over policy tokens (nats); None: unknown (vLLM)
    reward_errors: int = 0  # rewards that raised or returned no finite number (scored 0; --data rows)

    @property
    def rewards(self) -> list[float]:
        return [r.reward for r in self.rollouts]

    @property
    def generated_tokens(self) -> int:
        return sum(r.num_policy_tokens for r in self.rollouts)
