"""The GRPO policy update: trainer log-probs under the sampler's warping, clipped loss, N epochs x M
mini-batches of optimizer steps per batch (decoupled PPO).

    trainer = PolicyTrainer(policy, cfg)
    stats = trainer.step(batch)        # RolloutBatch -> TrainStats; policy_version += 1

Three policies meet in one update (grpo.py's glossary): the sampler that drew the tokens (maybe
stale, async), the trainer at the start of this update ("old": the PPO ratio's anchor, computed
once under no_grad) and the trainer now. With ppo_epochs = mini_batches = 1 (the default) there is
one optimizer step and the old log-probs are the detached log-probs of that same forward, so the
ratio is 1 and nothing clips; with more, every step after the first moves the weights away from
"old" and the clip bounds how far (as in PPO, and decoupled from the sampler's staleness, which the
truncated importance weight min(pi_old / pi_sampler, cap) corrects, as in AReaL).

Mini-batches split the batch's rows in a random order drawn from (seed, policy version), so a
resumed run reshuffles exactly as the uninterrupted one; advantages are computed over the whole
batch first (groups stay whole for the baseline). Each mini-batch's loss is its token-level mean.

The optimizer holds the trunk only: `mtp.*` parameters are excluded (the head changes only
through an online MTP strategy, with its own optimizer). With kl_coef > 0 a frozen copy of the
starting weights (trunk only) serves as the KL reference; with 0 no copy is kept.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from bebop.model.qwen3 import CausalLM
from bebop.policy import Policy
from bebop.precision import train_autocast
from bebop.rl.batch import TrainBatch, to_train_batch
from bebop.rl.config import RLConfig
from bebop.rl.grpo import GRPOLossInputs, GRPOLossOutput, grpo_loss, token_logprobs
from bebop.rl.records import RolloutBatch
from bebop.sampling import SamplingParams


@dataclass
class TrainStats:
    loss: float  # mean over the update's optimizer steps
    pg_loss: float
    kl: float
    clip_frac: float  # share of policy tokens whose ratio was clipped, over all steps of the update
    is_weight_mean: float
    is_truncated_frac: float
    train_entropy: float  # the trainer's entropy (warped as the sampler's) over policy tokens, before the update
    grad_norm: float  # mean pre-clip gradient norm over the optimizer steps
    optimizer_steps: int


def frozen_reference(model: CausalLM) -> CausalLM:
    """A frozen copy of `model` without its head (the KL reference)."""
    ref = copy.deepcopy(model).eval()
    ref.mtp = None
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def logprobs_of(model: CausalLM, batch: TrainBatch, sampling: SamplingParams,
                dtype: str = "float32") -> tuple[torch.Tensor, torch.Tensor]:
    """-> (log-probs (B, T-1) of ids[:, 1:], entropy (B, T-1)) under the sampler's warping; the forward
    runs in the training precision `dtype` (bebop.precision), the log-softmax in float32."""
    with train_autocast(model.device, dtype):
        logits = model.logits(model(batch.ids))  # (B, T, V)
    return token_logprobs(logits[:, :-1].float(), batch.ids[:, 1:], sampling)


def mini_batch_rows(rows: int, mini_batches: int, generator: torch.Generator) -> list[torch.Tensor]:
    """A random split of range(rows) into `mini_batches` near-equal index tensors."""
    return list(torch.randperm(rows, generator=generator).tensor_split(mini_batches))


class PolicyTrainer:
    def __init__(self, policy: Policy, cfg: RLConfig, *, reference: CausalLM | None = None,
                 policy_version: int = 0) -> None:
        """`reference`: the frozen starting policy, required when cfg.kl_coef > 0 (see frozen_reference)."""
        self.policy, self.cfg = policy, cfg
        self.params = policy.model.trunk_parameters()
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.99))
        if cfg.kl_coef > 0 and reference is None:
            raise ValueError("kl_coef > 0 needs a reference model")
        self.reference = reference if cfg.kl_coef > 0 else None
        self.policy_version = policy_version
        self.sampling = cfg.sampling

    def step(self, rollouts: RolloutBatch) -> TrainStats:
        cfg, model = self.cfg, self.policy.model
        batch = to_train_batch(rollouts, self.policy.pad_id).to(model.device)
        model.train()
        if cfg.ppo_epochs == 1 and cfg.mini_batches == 1:  # one step: "old" is this forward, detached
            logprobs, entropy = logprobs_of(model, batch, self.sampling, cfg.dtype)
            outs = [self._update(batch, logprobs, logprobs.detach())]
        else:
            with torch.no_grad():
                old, entropy = logprobs_of(model, batch, self.sampling, cfg.dtype)  # (B, T-1) the anchor of every step
            generator = torch.Generator().manual_seed(cfg.seed * 1_000_003 + self.policy_version)
            outs = []
            for _ in range(cfg.ppo_epochs):
                for rows in mini_batch_rows(batch.ids.shape[0], cfg.mini_batches, generator):
                    part = batch.rows(rows.to(model.device))
                    outs.append(self._update(part, logprobs_of(model, part, self.sampling, cfg.dtype)[0], old[rows]))
        self.policy_version += 1
        mask = batch.mask.float()
        return _summarise(outs, ((entropy * mask).sum() / mask.sum().clamp_min(1)).item())

    def _update(self, batch: TrainBatch, logprobs: torch.Tensor, old: torch.Tensor) -> tuple[GRPOLossOutput, float]:
        """One optimizer step on `batch` -> (loss terms, pre-clip gradient norm)."""
        ref = None
        if self.reference is not None:
            with torch.no_grad():
                ref = logprobs_of(self.reference, batch, self.sampling, self.cfg.dtype)[0]
        inputs = GRPOLossInputs(logprobs, old, batch.sampler_logprobs, batch.advantages, batch.mask, ref)
        out = grpo_loss(inputs, clip_eps=self.cfg.clip_eps, kl_coef=self.cfg.kl_coef, is_cap=self.cfg.is_cap)
        self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return out, float(grad_norm)


def _summarise(outs: list[tuple[GRPOLossOutput, float]], train_entropy: float) -> TrainStats:
    """Token-weighted means of the loss terms over an update's optimizer steps."""
    tokens = sum(o.num_tokens for o, _ in outs) or 1
    mean = lambda get: sum(get(o) * o.num_tokens for o, _ in outs) / tokens  # noqa: E731
    return TrainStats(loss=mean(lambda o: o.loss.item()), pg_loss=mean(lambda o: o.pg_loss), kl=mean(lambda o: o.kl),
                      clip_frac=mean(lambda o: o.clip_frac), is_weight_mean=mean(lambda o: o.is_weight_mean),
                      is_truncated_frac=mean(lambda o: o.is_truncated_frac), train_entropy=train_entropy,
                      grad_norm=sum(g for _, g in outs) / len(outs), optimizer_steps=len(outs))
