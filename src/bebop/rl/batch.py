"""RolloutBatch -> padded tensors for the policy update.

Alignment: position t of the (B, T-1) tensors is the prediction of ids[:, t+1] from ids[:, :t+1],
so `mask[b, t]` is True iff ids[b, t+1] is a token the policy sampled (not prompt, padding or an
environment observation), and `sampler_logprobs[b, t]` is the engine's log-prob of that token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from bebop.rl.grpo import group_advantages
from bebop.rl.records import RolloutBatch


@dataclass
class TrainBatch:
    ids: Tensor  # (B, T) prompt + completion, right-padded
    mask: Tensor  # (B, T-1) bool
    sampler_logprobs: Tensor  # (B, T-1) float32, 0 where mask is False
    advantages: Tensor  # (B,) float32

    def rows(self, index: Tensor) -> "TrainBatch":
        """The rows `index` (R,) of every tensor."""
        return TrainBatch(self.ids[index], self.mask[index], self.sampler_logprobs[index], self.advantages[index])

    @property
    def widths(self) -> Tensor:
        """(B,) ids each row needs: through its last policy token (at least 2: one prediction)."""
        positions = torch.arange(1, self.mask.shape[1] + 1, device=self.mask.device)  # (T-1,)
        return ((positions * self.mask).amax(dim=1) + 1).clamp_min(2)

    def trimmed(self) -> "TrainBatch":
        """The same rows without the columns none of them needs (right padding: exact under causal attention)."""
        width = int(self.widths.max())
        return TrainBatch(self.ids[:, :width], self.mask[:, :width - 1], self.sampler_logprobs[:, :width - 1],
                          self.advantages)

    def to(self, device: torch.device) -> "TrainBatch":
        return TrainBatch(self.ids.to(device), self.mask.to(device), self.sampler_logprobs.to(device),
                          self.advantages.to(device))


def to_train_batch(batch: RolloutBatch, pad_id: int) -> TrainBatch:
    rollouts = batch.rollouts
    width = max(len(r.prompt_ids) + len(r.token_ids) for r in rollouts)
    ids = torch.full((len(rollouts), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rollouts), width - 1, dtype=torch.bool)
    sampler = torch.zeros(len(rollouts), width - 1, dtype=torch.float32)
    for b, r in enumerate(rollouts):
        p, n = len(r.prompt_ids), len(r.token_ids)
        ids[b, : p + n] = torch.tensor(r.prompt_ids + r.token_ids)
        mask[b, p - 1: p - 1 + n] = torch.tensor(r.policy_mask, dtype=torch.bool)
        sampler[b, p - 1: p - 1 + n] = torch.tensor(r.sampler_logprobs, dtype=torch.float32)
    rewards = torch.tensor(batch.rewards, dtype=torch.float32).view(-1, batch.group_size)  # (N, G)
    return TrainBatch(ids, mask, sampler.masked_fill(~mask, 0.0), group_advantages(rewards).flatten())
