"""GRPO math worked by hand: advantages, PPO clipping, truncated IS weights, k3 KL, env-token masking,
and the trainer's log-probs at the sampler's temperature against the engine's own."""

import math

import pytest
import torch

from bebop.errors import BebopError
from bebop.rl.batch import to_train_batch
from bebop.rl.grpo import ADV_EPS, GRPOLossInputs, group_advantages, grpo_loss, k3_kl, token_logprobs, truncated_is_weights
from bebop.rl.records import Rollout, RolloutBatch
from bebop.sampling import SamplingParams


def test_group_advantages_use_the_population_std():
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]]))
    # group 1: mean 0.5, population std 0.5 -> (r - 0.5) / (0.5 + eps) = [1, -1, -1, 1] * 0.5 / (0.5 + eps)
    expected = torch.tensor([1.0, -1.0, -1.0, 1.0]) * 0.5 / (0.5 + ADV_EPS)
    assert torch.allclose(adv[0], expected, atol=1e-7, rtol=0)
    assert torch.equal(adv[1], torch.zeros(4))  # all-equal group: no signal


def test_group_advantages_reject_groups_below_two():
    with pytest.raises(BebopError, match="G >= 2"):
        group_advantages(torch.tensor([[1.0], [0.0]]))


def _loss(lp, old, sampler, adv, mask=None, **kw):
    lp = torch.tensor(lp, requires_grad=True)
    mask = torch.ones_like(lp, dtype=torch.bool) if mask is None else torch.tensor(mask)
    out = grpo_loss(GRPOLossInputs(lp, torch.tensor(old), torch.tensor(sampler), torch.tensor(adv), mask),
                    clip_eps=0.2, **kw)
    out.loss.backward()
    return out, lp.grad


def test_ppo_clipped_surrogate_hand_case():
    # two rollouts, one token each, ratio = 0.5 / 0.25 = 2 for both; IS weight 1 (sampler == old)
    lp, old = [[math.log(0.5)], [math.log(0.5)]], [[math.log(0.25)], [math.log(0.25)]]
    out, grad = _loss(lp, old, old, [1.0, -1.0])
    # A=+1: min(2, clip(2)=1.2) = 1.2 -> -1.2 (clipped: no gradient); A=-1: min(-2, -1.2) = -2 -> +2 (ratio 2)
    assert out.loss.item() == pytest.approx((-1.2 + 2.0) / 2)
    assert grad[0, 0].item() == 0.0
    assert grad[1, 0].item() == pytest.approx(2.0 / 2)  # d(ratio)/d(lp) = ratio, mean over 2 tokens
    assert out.clip_frac == 1.0 and out.num_tokens == 2


def test_truncated_is_weights():
    trainer = torch.log(torch.tensor([0.5, 0.1, 0.3]))
    sampler = torch.log(torch.tensor([0.1, 0.2, 0.3]))
    w = truncated_is_weights(trainer, sampler, cap=2.0)
    assert torch.allclose(w, torch.tensor([2.0, 0.5, 1.0]))  # 5 truncated to 2
    # the weight scales the token's surrogate and gradient, and carries no gradient itself
    out, grad = _loss([[math.log(0.1)]], [[math.log(0.1)]], [[math.log(0.2)]], [1.0])
    assert out.loss.item() == pytest.approx(-0.5) and grad[0, 0].item() == pytest.approx(-0.5)
    assert out.is_weight_mean == pytest.approx(0.5)


def test_k3_kl_hand_case_and_coefficient():
    lp, ref = torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25]))
    assert k3_kl(lp, ref).item() == pytest.approx(0.5 - math.log(0.5) - 1)
    assert k3_kl(lp, lp).item() == 0.0
    x = torch.tensor([[math.log(0.5)]], requires_grad=True)
    out = grpo_loss(GRPOLossInputs(x, x.detach(), x.detach(), torch.tensor([0.0]), torch.ones(1, 1, dtype=torch.bool),
                                   ref), clip_eps=0.2, kl_coef=0.1)
    assert out.loss.item() == pytest.approx(0.1 * (0.5 - math.log(0.5) - 1))


def _rollout(prompt, tokens, mask, reward=0.0):
    return Rollout(prompt, tokens, [-0.5] * len(tokens), mask, reward, 0)


def test_environment_tokens_are_masked_out_of_the_loss():
    rollouts = [_rollout([5, 6], [7, 8, 9, 10], [True, False, False, True], 1.0),
                _rollout([5], [7, 8], [True, True], 0.0)]
    batch = to_train_batch(RolloutBatch(rollouts, 2, 0, 0, 0.0, None, 0.5, 0.0), pad_id=0)
    assert batch.ids.tolist() == [[5, 6, 7, 8, 9, 10], [5, 7, 8, 0, 0, 0]]
    # mask[b, t]: ids[b, t+1] is a policy token
    assert batch.mask.tolist() == [[False, True, False, False, True], [True, True, False, False, False]]
    assert batch.sampler_logprobs[0].tolist() == [0.0, -0.5, 0.0, 0.0, -0.5]
    assert batch.advantages.tolist() == pytest.approx([1.0, -1.0], abs=1e-5)
    lp = torch.full(batch.mask.shape, -0.5, requires_grad=True)
    out = grpo_loss(GRPOLossInputs(lp, lp.detach(), batch.sampler_logprobs, batch.advantages, batch.mask),
                    clip_eps=0.2)
    out.loss.backward()
    assert out.num_tokens == 4
    assert torch.equal(lp.grad != 0, batch.mask)  # env tokens, prompt and padding get exactly zero gradient


@pytest.mark.parametrize("sampling,other", [
    (SamplingParams(0.7), SamplingParams(1.4)),
    (SamplingParams(1.3), SamplingParams(2.6)),
    (SamplingParams(1.0, top_k=4), SamplingParams(1.0)),  # the unwarped log-probs would be smaller
    (SamplingParams(1.0, top_p=0.7), SamplingParams(1.0)),
])
def test_trainer_logprobs_under_the_samplers_warping_match_the_engine(tiny_model_dir, sampling, other):
    from bebop.engine import generate
    from bebop.policy import load_policy
    from bebop.rl.trainer import logprobs_of

    policy = load_policy(tiny_model_dir, device="cpu")
    gens = generate(policy.model, [[10, 11, 12], [13, 14]], max_new_tokens=8,
                    generator=torch.Generator().manual_seed(0), sampling=sampling)
    rollouts = [Rollout(g.prompt_ids, g.token_ids, g.logprobs, g.policy_mask, float(i), 0) for i, g in enumerate(gens)]
    batch = to_train_batch(RolloutBatch(rollouts, 2, 0, 0, 0.0, None, 0.0, 0.0), policy.pad_id)
    with torch.no_grad():
        lp, _ = logprobs_of(policy.model, batch, sampling)
    assert torch.allclose(lp[batch.mask], batch.sampler_logprobs[batch.mask], atol=1e-4)
    # under another warping they differ: the recomputation must use the sampler's
    with torch.no_grad():
        wrong, _ = logprobs_of(policy.model, batch, other)
    assert not torch.allclose(wrong[batch.mask], batch.sampler_logprobs[batch.mask], atol=1e-3)


def test_token_logprobs_reject_temperature_zero():
    with pytest.raises(BebopError, match="temperature"):
        token_logprobs(torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long), SamplingParams(0.0))
