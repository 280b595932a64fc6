"""GRPO math as pure functions (docs/method.md section 6).

Glossary (one PPO/GRPO update on a batch of rollouts):
    sampler log-probs   what the engine reported for each emitted token: log of the
                        temperature-warped target distribution of the weights that sampled it
                        (possibly `staleness` versions old in async mode)
    old log-probs       the trainer's log-probs of the same tokens before this update (detached),
                        recomputed under the sampler's warping (temperature, top-k, top-p)
    log-probs           the trainer's log-probs, with gradient
    ratio               exp(log-probs - old log-probs): the PPO ratio, clipped to [1-eps, 1+eps_high]
                        (eps_high = eps unless set: DAPO's Clip-Higher lets unlikely tokens rise further)
    IS weight           min(exp(old - sampler), cap): truncated importance weight correcting for
                        the sampler/trainer mismatch (stale weights, numerics); no gradient
    advantage           (r - mean_group) / (std_group + eps), population std (ddof 0)
    k3 KL               exp(ref - lp) - (ref - lp) - 1 >= 0, an unbiased KL(pi || ref) estimate
    entropy             of the trainer's warped distribution at each policy token; with gradient only
                        when the loss carries an entropy bonus

loss = pg_loss + kl_coef * KL - entropy_coef * entropy, each term a token mean over policy tokens;
the KL and entropy terms are skipped (not computed) when their coefficient is 0.

Token-level aggregation (DAPO): the loss is the mean over every policy token of the batch, so
long completions are not down-weighted; environment tokens (policy_mask False), prompt and
padding are masked out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from bebop.errors import BebopError
from bebop.sampling import SamplingParams
from bebop.sampling.warp import warp_logits

ADV_EPS = 1e-6
MASKED_LOGIT = -1e9  # the trainer's logit for a token its warping drops (finite: see token_logprobs)


def group_advantages(rewards: Tensor, eps: float = ADV_EPS) -> Tensor:
    """rewards (N, G) -> advantages (N, G): per group, (r - mean) / (population std + eps).

    A group whose rewards are all equal gets zero advantage (no signal, no noise)."""
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise BebopError(f"GRPO needs rewards shaped (prompts, G) with G >= 2, got {tuple(rewards.shape)}")
    rewards = rewards.float()
    mean = rewards.mean(dim=1, keepdim=True)  # (N, 1)
    std = rewards.std(dim=1, unbiased=False, keepdim=True)  # (N, 1)
    return (rewards - mean) / (std + eps)


def token_logprobs(logits: Tensor, tokens: Tensor, sampling: SamplingParams,
                   entropy_grad: bool = False) -> tuple[Tensor, Tensor]:
    """logits (B, T, V), tokens (B, T) -> (log-probs (B, T), entropy (B, T)) of the distribution the
    engine sampled from: temperature, then top-k / top-p (sampling.warp_logits, the sampler's own
    function). The entropy is detached unless `entropy_grad` (an entropy bonus in the loss).

    Why this keeps the update unbiased: the rollouts are samples of the warped policy pi_w, so the
    policy gradient and the importance ratios must use pi_w's own log-probs. The sampler reports
    log pi_w(y); log-probs of the unwarped pi would be smaller by the log of the kept mass on every
    token, so exp(old - sampler) would sit below 1 for all tokens and down-weight every update by
    that mass. With the same function on both sides the ratio is 1 when the weights agree. A token
    that falls outside the trainer's current top-k / top-p set (stale async weights) gets a
    log-prob near MASKED_LOGIT: importance weight 0, no gradient, no NaN."""
    if not sampling.temperature > 0:
        raise BebopError(f"RL needs a sampling temperature > 0, got {sampling.temperature}")
    logp = torch.log_softmax(warp_logits(logits, sampling, fill=MASKED_LOGIT), dim=-1)  # (B, T, V)
    picked = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (B, T)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = -(logp.exp() * logp).sum(-1)  # (B, T)
    return picked, entropy


def truncated_is_weights(trainer_logprobs: Tensor, sampler_logprobs: Tensor, cap: float) -> Tensor:
    """(B, T), (B, T) -> min(pi_trainer / pi_sampler, cap) (B, T), detached."""
    ratio = torch.exp((trainer_logprobs.detach() - sampler_logprobs).clamp(max=30.0))
    return ratio.clamp(max=cap)


def k3_kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """(B, T), (B, T) -> per-token k3 estimate of KL(pi || ref) (B, T), >= 0."""
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1.0


@dataclass
class GRPOLossInputs:
    logprobs: Tensor  # (B, T) trainer, with gradient
    old_logprobs: Tensor  # (B, T) trainer before the update, detached
    sampler_logprobs: Tensor  # (B, T) carried by the rollouts
    advantages: Tensor  # (B,) one per rollout
    mask: Tensor  # (B, T) bool: policy tokens
    ref_logprobs: Tensor | None = None  # (B, T) reference policy, when KL is on
    entropy: Tensor | None = None  # (B, T) trainer entropy with gradient, when the entropy bonus is on


@dataclass
class GRPOLossOutput:
    loss: Tensor  # scalar, with gradient
    pg_loss: float
    kl: float  # mean k3 KL over policy tokens (0.0 when off)
    clip_frac: float  # share of policy tokens whose ratio was clipped
    is_weight_mean: float
    is_truncated_frac: float  # share of policy tokens whose IS weight hit the cap
    num_tokens: int
    sampler_kl: float = 0.0  # k3 KL(sampler || trainer) over policy tokens: what the IS weight corrects
    entropy: float = 0.0  # mean trainer entropy over policy tokens, the bonus's (0.0 when off)


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum() / mask.sum().clamp_min(1)


def grpo_loss(inputs: GRPOLossInputs, *, clip_eps: float, kl_coef: float = 0.0, is_cap: float = 2.0,
              clip_eps_high: float = 0.0, entropy_coef: float = 0.0) -> GRPOLossOutput:
    """Token-level PPO-clipped surrogate (ratio clipped to [1 - clip_eps, 1 + (clip_eps_high or clip_eps)]),
    weighted by truncated IS weights, plus kl_coef * k3 KL, minus entropy_coef * entropy."""
    lp, mask = inputs.logprobs, inputs.mask.to(inputs.logprobs.dtype)  # (B, T)
    if lp.shape != inputs.old_logprobs.shape or lp.shape != inputs.sampler_logprobs.shape or lp.shape != mask.shape:
        raise BebopError("grpo_loss: logprobs, old_logprobs, sampler_logprobs and mask must share one (B, T) shape")
    adv = inputs.advantages.unsqueeze(1)  # (B, 1)
    ratio = torch.exp(lp - inputs.old_logprobs)  # (B, T)
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + (clip_eps_high or clip_eps))
    weight = truncated_is_weights(inputs.old_logprobs, inputs.sampler_logprobs, is_cap)  # (B, T)
    surrogate = -torch.minimum(ratio * adv, clipped * adv) * weight  # (B, T)
    pg = masked_mean(surrogate, mask)
    loss, kl, entropy = pg, torch.zeros(()), torch.zeros(())
    if inputs.ref_logprobs is not None and kl_coef:
        kl = masked_mean(k3_kl(lp, inputs.ref_logprobs), mask)
        loss = pg + kl_coef * kl
    if entropy_coef:
        if inputs.entropy is None or inputs.entropy.shape != lp.shape:
            raise BebopError("grpo_loss: entropy_coef needs inputs.entropy, the (B, T) entropy with gradient")
        entropy = masked_mean(inputs.entropy, mask)  # the surrogate's token mean, without the IS weight
        loss = loss - entropy_coef * entropy
    with torch.no_grad():
        was_clipped = ((ratio - clipped).abs() > 0).float()
        sampler_kl = masked_mean(k3_kl(inputs.sampler_logprobs, inputs.old_logprobs), mask)  # samples are the sampler's
        return GRPOLossOutput(loss, pg.item(), kl.item(), masked_mean(was_clipped, mask).item(),
                              masked_mean(weight, mask).item(), masked_mean((weight >= is_cap).float(), mask).item(),
                              int(mask.sum().item()), sampler_kl.item(), entropy.item())
