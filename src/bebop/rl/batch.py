"""RolloutBatch -> padded tensors for the policy update.

Alignment: position t of the (B, T-1) tensors is the prediction of ids[:, t+1] from ids[:, :t+1],
so `mask[b, t]` is True iff ids[b, t+1] is a token the policy sampled (not prompt, padding or an
environment observation), and `sampler_logprobs[b, t]` is the engine's log-prob of that token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from bebop.model.packing import Packing, pack
from bebop.rl.grpo import group_advantages
from bebop.rl.records import RolloutBatch


@dataclass
class TrainBatch:
    ids: Tensor  # (B, T) prompt + completion, right-padded
    mask: Tensor  # (B, T-1) bool
    sampler_logprobs: Tensor  # (B, T-1) float32, 0 where mask is False
    advantages: Tensor  # (B,) float32
    prompt_lens: Tensor  # (B,) long: the prompt's tokens at the start of each row
    prompts: Tensor  # (B,) long: rows with equal values have equal prompts (a group's rollouts)

    def rows(self, index: Tensor) -> "TrainBatch":
        """The rows `index` (R,) of every tensor."""
        return TrainBatch(self.ids[index], self.mask[index], self.sampler_logprobs[index], self.advantages[index],
                          self.prompt_lens[index], self.prompts[index])

    @property
    def widths(self) -> Tensor:
        """(B,) ids each row needs: through its last policy token (at least 2: one prediction)."""
        positions = torch.arange(1, self.mask.shape[1] + 1, device=self.mask.device)  # (T-1,)
        return ((positions * self.mask).amax(dim=1) + 1).clamp_min(2)

    def trimmed(self) -> "TrainBatch":
        """The same rows without the columns none of them needs (right padding: exact under causal attention)."""
        width = int(self.widths.max())
        return TrainBatch(self.ids[:, :width], self.mask[:, :width - 1], self.sampler_logprobs[:, :width - 1],
                          self.advantages, self.prompt_lens, self.prompts)

    def to(self, device: torch.device) -> "TrainBatch":
        return TrainBatch(*(t.to(device) for t in (self.ids, self.mask, self.sampler_logprobs, self.advantages,
                                                   self.prompt_lens, self.prompts)))

    def packed(self) -> "PackedRows | None":
        """The rows as one packed sequence (model/packing.py), each distinct prompt once and each row through
        its last policy token; None when no row has a prediction to make."""
        lens, labels, widths = self.prompt_lens.tolist(), self.prompts.tolist(), self.widths.tolist()
        prompts: list[Tensor] = []
        first: dict[int, int] = {}  # prompt label -> its index in `prompts`
        continuations, kept = [], []
        for r, (p, w) in enumerate(zip(lens, widths, strict=True)):
            if w - 1 < p:  # its columns p-1 .. w-2 are none
                continue
            g = first.setdefault(labels[r], len(prompts))
            if g == len(prompts):
                prompts.append(self.ids[r, :p])
            continuations.append((g, self.ids[r, p: w - 1]))  # the tokens after the prompt that predict
            kept.append(r)
        if not kept:
            return None
        packing = pack(prompts, continuations)
        rows = torch.tensor(kept, device=self.ids.device)[packing.output_rows]  # (M,)
        columns = self.prompt_lens[rows] - 1 + packing.output_steps  # (M,) column t predicts ids[:, t + 1]
        return PackedRows(packing, self.ids[rows, columns + 1], rows, columns, self.mask.shape)


@dataclass
class PackedRows:
    """A TrainBatch packed: what each output of the packing predicts, and where its value goes in the batch."""

    packing: Packing
    targets: Tensor  # (M,) the token each output predicts
    rows: Tensor  # (M,) its row in the batch
    columns: Tensor  # (M,) its column in the (B, T-1) layout
    shape: torch.Size  # (B, T-1)

    def unpack(self, values: Tensor) -> Tensor:
        """values (M,) -> (B, T-1), 0 where no output lands (prompt and padding columns)."""
        return values.new_zeros(self.shape).index_put((self.rows, self.columns), values)


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
    first: dict[tuple[int, ...], int] = {}
    prompts = [first.setdefault(tuple(r.prompt_ids), b) for b, r in enumerate(rollouts)]
    return TrainBatch(ids, mask, sampler.masked_fill(~mask, 0.0), group_advantages(rewards).flatten(),
                      torch.tensor([len(r.prompt_ids) for r in rollouts]), torch.tensor(prompts))
