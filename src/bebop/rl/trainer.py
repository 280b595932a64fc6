"""The GRPO policy update: trainer log-probs at the sampler's temperature, clipped loss, one step.

    trainer = PolicyTrainer(policy, cfg)
    stats = trainer.step(batch)        # RolloutBatch -> TrainStats; policy_version += 1

The optimizer holds the trunk only: `mtp.*` parameters are excluded (the head changes only
through an online MTP strategy, with its own optimizer). With kl_coef > 0 a frozen copy of the
starting weights (trunk only) serves as the KL reference; with 0 no copy is kept.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from bebop.policy import Policy
from bebop.rl.batch import TrainBatch, to_train_batch
from bebop.rl.config import RLConfig
from bebop.rl.grpo import GRPOLossInputs, GRPOLossOutput, grpo_loss, token_logprobs
from bebop.rl.mtp_online import trunk_parameters
from bebop.rl.records import RolloutBatch


@dataclass
class TrainStats:
    loss: GRPOLossOutput
    train_entropy: float  # the trainer's entropy at T over policy tokens
    grad_norm: float


def frozen_reference(model) -> torch.nn.Module:
    """A frozen copy of `model` without its head (the KL reference)."""
    ref = copy.deepcopy(model).eval()
    ref.mtp = None
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def logprobs_of(model, batch: TrainBatch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (log-probs (B, T-1) of ids[:, 1:], entropy (B, T-1)) at the sampling temperature."""
    logits = model.logits(model(batch.ids))  # (B, T, V)
    return token_logprobs(logits[:, :-1], batch.ids[:, 1:], temperature)


class PolicyTrainer:
    def __init__(self, policy: Policy, cfg: RLConfig, *, reference: torch.nn.Module | None = None,
                 policy_version: int = 0) -> None:
        """`reference`: the frozen starting policy, required when cfg.kl_coef > 0 (see frozen_reference)."""
        self.policy, self.cfg = policy, cfg
        self.params = trunk_parameters(policy.model)
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.99))
        if cfg.kl_coef > 0 and reference is None:
            raise ValueError("kl_coef > 0 needs a reference model")
        self.reference = reference if cfg.kl_coef > 0 else None
        self.policy_version = policy_version

    def step(self, rollouts: RolloutBatch) -> TrainStats:
        cfg, model = self.cfg, self.policy.model
        batch = to_train_batch(rollouts, self.policy.pad_id).to(model.device)
        model.train()
        logprobs, entropy = logprobs_of(model, batch, cfg.temperature)
        ref = None
        if self.reference is not None:
            with torch.no_grad():
                ref = logprobs_of(self.reference, batch, cfg.temperature)[0]
        # one update per batch: the trainer's pre-update log-probs are these, detached
        inputs = GRPOLossInputs(logprobs, logprobs.detach(), batch.sampler_logprobs, batch.advantages, batch.mask, ref)
        out = grpo_loss(inputs, clip_eps=cfg.clip_eps, kl_coef=cfg.kl_coef, is_cap=cfg.is_cap)
        self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.policy_version += 1
        mask = batch.mask.float()
        return TrainStats(out, ((entropy * mask).sum() / mask.sum().clamp_min(1)).item(), float(grad_norm))
