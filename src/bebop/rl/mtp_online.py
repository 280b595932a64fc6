"""Online MTP strategies during RL (docs/method.md section 6): none | ce | tv | e2e_tv.

    online = make_online_mtp(policy, cfg)          # None for "none": the pre-RL head stays frozen
    stats = online.update(batch.rollouts)          # one step of the draft loss on this step's rollouts

The head has its own AdamW, learning rate (`mtp_lr`) and grad-norm clipping. The draft loss
never reaches the trunk: during the update every non-mtp parameter has requires_grad off, and
gradients are taken with `torch.autograd.grad` w.r.t. the head's parameters only, so no trunk
`.grad` is written and the policy optimizer's state is never touched. The targets are the
current trunk's distributions at the sampling temperature (chain_step), so the head follows the
policy as it moves.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from bebop.model.qwen3 import CausalLM
from bebop.mtp.data import Sequence as DraftSequence
from bebop.mtp.train_config import MTPTrainConfig
from bebop.mtp.train_step import chain_step, make_batch
from bebop.policy import Policy
from bebop.rl.config import RLConfig
from bebop.rl.records import Rollout


@contextmanager
def trunk_frozen(model: CausalLM) -> Iterator[None]:
    """requires_grad off for every non-mtp parameter inside the block, restored after."""
    trunk = model.trunk_parameters()
    saved = [p.requires_grad for p in trunk]
    for p in trunk:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in zip(trunk, saved):
            p.requires_grad_(flag)


@dataclass
class MTPUpdateStats:
    loss: float
    acceptance_per_depth: list[float]  # 1 - TV per depth on the step's chains (teacher-forced)
    num_chains: int


def to_draft_sequences(rollouts: Sequence[Rollout]) -> list[DraftSequence]:
    return [DraftSequence(r.prompt_ids, r.token_ids, [not m for m in r.policy_mask]) for r in rollouts]


class OnlineMTP:
    def __init__(self, policy: Policy, loss: str, cfg: RLConfig) -> None:
        self.policy = policy
        self.params = policy.model.head_parameters()
        self.train_cfg = MTPTrainConfig(loss=loss, depths=cfg.draft_depths, temperature=cfg.temperature, lr=cfg.mtp_lr,
                                        grad_clip=cfg.mtp_grad_clip)
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.mtp_lr, weight_decay=0.0, betas=(0.9, 0.95))

    def update(self, rollouts: Sequence[Rollout]) -> MTPUpdateStats:
        cfg = self.train_cfg
        model = self.policy.model
        batch = make_batch(to_draft_sequences(rollouts), cfg.depths, self.policy.pad_id)
        batch.ids, batch.keep = batch.ids.to(model.device), batch.keep.to(model.device)
        with trunk_frozen(model):
            result = chain_step(self.policy, batch, cfg)
            if result.num_chains == 0:
                return MTPUpdateStats(0.0, [], 0)
            grads = torch.autograd.grad(result.loss, self.params, allow_unused=True)
        for p, g in zip(self.params, grads):
            p.grad = g
        torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return MTPUpdateStats(result.loss.item(), [round(a, 4) for a in result.acceptance_per_depth.tolist()],
                              result.num_chains)


def make_online_mtp(policy: Policy, cfg: RLConfig) -> OnlineMTP | None:
    """The strategy, chosen once: "none" -> None, else an updater for that draft loss."""
    if cfg.mtp_update == "none":
        return None
    policy.model.require_mtp()
    return OnlineMTP(policy, cfg.mtp_update, cfg)
