"""Typed records the engine returns: one `Generation` per prompt."""

from __future__ import annotations

from dataclasses import dataclass, field

FINISH_STOP = "stop"  # a stop token was emitted (it is the last of token_ids)
FINISH_LENGTH = "length"  # max_new_tokens ran out
FINISH_CONTEXT = "context"  # the model's context ran out first (the prompt left less room than max_new_tokens)
TRUNCATED = (FINISH_LENGTH, FINISH_CONTEXT)  # cut before the row stopped on its own


@dataclass
class Generation:
    """What one row produced after its prompt.

    token_ids: every new token, observation tokens (agent task) included, stop token included.
    logprobs / entropies: the sampler's log-prob of each token and the entropy of the
        distribution it was sampled from (temperature/top-k/top-p applied); 0.0 for tokens
        that are not the policy's.
    policy_mask: False for tokens the environment inserted (never trained on).
    """

    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    policy_mask: list[bool] = field(default_factory=list)
    finish_reason: str | None = None
    forwards: int = 0  # target forwards that emitted tokens for this row (tokens / forwards: its accept length)
    drafts_by_source: dict[str, list[int]] = field(default_factory=dict)  # drafter -> [drafts, accepted tokens]

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def completion_ids(self) -> list[int]:
        """The generated ids without the final stop token (what a completion's text decodes)."""
        return self.token_ids[:-1] if self.finish_reason == FINISH_STOP else list(self.token_ids)

    @property
    def num_policy_tokens(self) -> int:
        return sum(self.policy_mask)
