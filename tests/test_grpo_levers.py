"""Two levers on the policy's entropy: DAPO's asymmetric clip (--clip-eps-high) and an entropy bonus
(--entropy-coef), worked by hand, against autograd, through the trainer and the CLI, and refused when bad."""

import json
import math

import pytest
import torch

from bebop.cli import main
from bebop.errors import BebopError
from bebop.policy import load_policy
from bebop.rl.grpo import GRPOLossInputs, grpo_loss, masked_mean, token_logprobs, truncated_is_weights
from bebop.rl.records import Rollout, RolloutBatch
from bebop.rl.trainer import PolicyTrainer
from bebop.sampling import SamplingParams

from rl_helpers import read_metrics, rl_cfg

# 1. Clip-Higher: the ratio is clipped to [1 - clip_eps, 1 + clip_eps_high]


def test_clip_higher_clips_positive_advantages_at_one_plus_high_and_negative_at_one_minus_eps():
    ratios = torch.tensor([[1.5, 1.25, 0.5, 0.9]])  # one rollout per column, one token each
    lp = ratios.log().T.contiguous().requires_grad_(True)  # (4, 1); old log-probs 0: ratio = exp(lp)
    old = torch.zeros(4, 1)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    out = grpo_loss(GRPOLossInputs(lp, old, old, adv, torch.ones(4, 1, dtype=torch.bool)),
                    clip_eps=0.2, clip_eps_high=0.28)
    out.loss.backward()
    # A=+1, r=1.5: min(1.5, 1.28) = 1.28, clipped at 1 + high (no gradient)
    # A=+1, r=1.25: inside [0.8, 1.28]: 1.25 with gradient r (symmetric 0.2 would clip it at 1.2)
    # A=-1, r=0.5: min(-0.5, -0.8) = -0.8, clipped at 1 - eps (no gradient)
    # A=-1, r=0.9: inside: -0.9 with gradient -r
    expected = (-1.28 - 1.25 + 0.8 + 0.9) / 4
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)
    assert lp.grad[:, 0].tolist() == pytest.approx([0.0, -1.25 / 4, 0.0, 0.9 / 4], rel=1e-6)
    assert out.clip_frac == 0.5  # r = 1.5 and r = 0.5 lie outside [0.8, 1.28]
    symmetric = grpo_loss(GRPOLossInputs(lp, old, old, adv, torch.ones(4, 1, dtype=torch.bool)), clip_eps=0.2)
    assert symmetric.loss.item() == pytest.approx((-1.2 - 1.2 + 0.8 + 0.9) / 4, rel=1e-6)
    assert symmetric.clip_frac == 0.75


def test_clip_eps_high_zero_is_the_symmetric_clip_bit_for_bit():
    inputs = _inputs(torch.Generator().manual_seed(3))
    lp, _ = token_logprobs(inputs["logits"], inputs["tokens"], SamplingParams(0.7))
    old = lp.detach() - 0.3  # ratio e^0.3 = 1.35: above 1.2, below 1.5
    args = GRPOLossInputs(lp, old, inputs["sampler"], inputs["adv"], inputs["mask"])
    default = grpo_loss(args, clip_eps=0.2).loss
    assert torch.equal(default, grpo_loss(args, clip_eps=0.2, clip_eps_high=0.0).loss)
    assert torch.equal(default, grpo_loss(args, clip_eps=0.2, clip_eps_high=0.2).loss)
    assert not torch.equal(default, grpo_loss(args, clip_eps=0.2, clip_eps_high=0.5).loss)


# 2. the entropy bonus: loss = pg_loss + kl_coef * kl - entropy_coef * (token-mean entropy), with gradient


def _inputs(generator):
    logits = (torch.randn(2, 3, 5, generator=generator) * 2).requires_grad_(True)  # (B, T, V)
    tokens = torch.randint(0, 5, (2, 3), generator=generator)  # (B, T)
    sampler = -torch.rand(2, 3, generator=generator) * 2  # IS weights != 1: the bonus is not weighted by them
    mask = torch.tensor([[True, True, False], [True, False, True]])
    return {"logits": logits, "tokens": tokens, "sampler": sampler, "adv": torch.tensor([1.0, -0.5]), "mask": mask}


def _loss_and_grad(x, coef, sampling):
    lp, entropy = token_logprobs(x["logits"], x["tokens"], sampling, entropy_grad=coef > 0)
    out = grpo_loss(GRPOLossInputs(lp, lp.detach(), x["sampler"], x["adv"], x["mask"], entropy=entropy),
                    clip_eps=0.2, entropy_coef=coef)
    return out, torch.autograd.grad(out.loss, x["logits"])[0]


@pytest.mark.parametrize("sampling", [SamplingParams(1.0), SamplingParams(0.7)])
def test_the_entropy_bonus_gradient_is_the_pg_gradient_minus_coef_times_the_entropys(sampling):
    x, coef = _inputs(torch.Generator().manual_seed(0)), 0.3
    with_bonus, grad = _loss_and_grad(x, coef, sampling)
    plain, pg_grad = _loss_and_grad(x, 0.0, sampling)
    # the entropy computed independently: torch's Categorical at the sampler's temperature
    entropy = torch.distributions.Categorical(logits=x["logits"] / sampling.temperature).entropy()  # (B, T)
    mean_entropy = (entropy * x["mask"]).sum() / x["mask"].sum()  # token mean over policy tokens
    entropy_grad = torch.autograd.grad(mean_entropy, x["logits"])[0]
    assert entropy_grad.abs().max() > 1e-3  # the check below has something to check
    torch.testing.assert_close(grad, pg_grad - coef * entropy_grad, rtol=1e-5, atol=1e-6)
    assert with_bonus.entropy == pytest.approx(mean_entropy.item(), rel=1e-5)
    assert with_bonus.loss.item() == pytest.approx(with_bonus.pg_loss - coef * with_bonus.entropy, rel=1e-5)
    assert with_bonus.pg_loss == plain.pg_loss and plain.entropy == 0.0


def test_entropy_coef_zero_is_todays_loss_and_takes_no_entropy_gradient():
    x = _inputs(torch.Generator().manual_seed(1))
    sampling = SamplingParams(0.7)
    lp, entropy = token_logprobs(x["logits"], x["tokens"], sampling)
    assert not entropy.requires_grad and lp.requires_grad  # the default: detached, as before the bonus existed
    out = grpo_loss(GRPOLossInputs(lp, lp.detach(), x["sampler"], x["adv"], x["mask"]), clip_eps=0.2)
    # today's loss, op for op: the clipped surrogate weighted by the truncated IS weight, token mean
    old, mask = lp.detach(), x["mask"].float()
    ratio = torch.exp(lp - old)
    weight = truncated_is_weights(old, x["sampler"], 2.0)
    today = masked_mean(-torch.minimum(ratio * x["adv"][:, None], ratio.clamp(0.8, 1.2) * x["adv"][:, None]) * weight,
                        mask)
    assert torch.equal(out.loss, today)
    _, with_grad = token_logprobs(x["logits"], x["tokens"], sampling, entropy_grad=True)
    ignored = grpo_loss(GRPOLossInputs(lp, old, x["sampler"], x["adv"], x["mask"], entropy=with_grad), clip_eps=0.2)
    assert torch.equal(ignored.loss, today) and ignored.entropy == 0.0  # coefficient 0: the term is not built


def test_a_bonus_without_its_entropy_is_an_error():
    x = _inputs(torch.Generator().manual_seed(2))
    lp, _ = token_logprobs(x["logits"], x["tokens"], SamplingParams(1.0))
    with pytest.raises(BebopError, match="entropy_coef needs inputs.entropy"):
        grpo_loss(GRPOLossInputs(lp, lp.detach(), x["sampler"], x["adv"], x["mask"]), clip_eps=0.2, entropy_coef=0.1)


def _batch(vocab):
    """Two groups of two rollouts with different lengths, an environment token in one, rewards 1/0."""
    gen = torch.Generator().manual_seed(0)
    rollouts = []
    for i, n in enumerate((5, 3, 7, 4)):
        tokens = torch.randint(8, vocab, (n,), generator=gen).tolist()
        mask = [j != 2 for j in range(n)]
        rollouts.append(Rollout([9, 10, 11], tokens, [-1.5 if m else 0.0 for m in mask], mask, float(i % 2 == 0), 0))
    return RolloutBatch(rollouts, 2, 0, 0, 0.0, None, 0.0, 0.0)


def _spy_entropy_grad(monkeypatch) -> list:
    """The entropy_grad of every trainer forward taken with gradient enabled (the update's, not the anchor's)."""
    import bebop.rl.trainer

    seen: list = []
    real = bebop.rl.trainer.token_logprobs

    def spy(logits, tokens, sampling, entropy_grad=False):
        if torch.is_grad_enabled():
            seen.append(entropy_grad)
        return real(logits, tokens, sampling, entropy_grad)

    monkeypatch.setattr(bebop.rl.trainer, "token_logprobs", spy)
    return seen


@pytest.mark.parametrize("coef", [0.0, 0.5])
def test_the_trainer_takes_the_entropy_with_gradient_only_for_a_bonus(headed, monkeypatch, coef):
    seen = _spy_entropy_grad(monkeypatch)
    steps = {}
    for micro in (0, 1):  # the bonus accumulates over micro-batches to the same step as one forward
        policy = load_policy(headed, device="cpu")
        trainer = PolicyTrainer(policy, rl_cfg(headed, group_size=2, lr=1e-2, entropy_coef=coef, micro_batch_size=micro))
        stats = trainer.step(_batch(policy.codec.vocab_size))
        steps[micro] = dict(policy.model.named_parameters())
        # one optimizer step: the bonus's entropy is the reported train_entropy
        assert stats.loss == pytest.approx(stats.pg_loss - coef * stats.train_entropy, rel=1e-5, abs=1e-7)
    assert seen and set(seen) == {coef > 0}
    for name, p in steps[0].items():
        torch.testing.assert_close(steps[1][name], p, rtol=1e-4, atol=1e-5)


# 3. through `bebop rl`


def _rl(model, run, *extra):
    return ["rl", "--model", str(model), "--task", "math", "--steps", "2", "--out", str(run), "--group-size", "2",
            "--batch-prompts", "2", "--max-new-tokens", "8", "--save-every", "1", "--device", "cpu", "--no-progress",
            *extra]


def test_a_run_with_both_levers_saves_them_and_resumes(headed, tmp_path, digit_reward, monkeypatch, capsys):
    import bebop.rl.trainer

    calls: list = []
    real = bebop.rl.trainer.grpo_loss
    monkeypatch.setattr(bebop.rl.trainer, "grpo_loss", lambda inputs, **kw: (calls.append(kw), real(inputs, **kw))[1])
    run = tmp_path / "run"
    levers = ["--entropy-coef", "0.05", "--clip-eps-high", "0.28"]
    assert main(_rl(headed, run, *levers)) == 0
    saved = json.loads((run / "config.json").read_text())
    assert saved["entropy_coef"] == 0.05 and saved["clip_eps_high"] == 0.28
    assert calls and all(kw["entropy_coef"] == 0.05 and kw["clip_eps_high"] == 0.28 for kw in calls)
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:  # one optimizer step a batch: loss = pg_loss - entropy_coef * train_entropy
        assert math.isfinite(r["loss"]) and r["train_entropy"] > 0
        assert r["loss"] == pytest.approx(r["pg_loss"] - 0.05 * r["train_entropy"], rel=1e-5, abs=1e-7)
    assert main(_rl(headed, run, "--entropy-coef", "0.1", "--clip-eps-high", "0.28", "--resume")) == 2
    assert "config differs in entropy_coef" in capsys.readouterr().err
    # a run saved before the levers existed: its config.json lacks them, and resumes with their defaults
    (run / "config.json").write_text(json.dumps({k: v for k, v in saved.items()
                                                 if k not in ("entropy_coef", "clip_eps_high")}))
    assert main(_rl(headed, run, "--resume")) == 0
    assert main(_rl(headed, run, *levers, "--resume")) == 2
    assert "config differs in clip_eps_high, entropy_coef" in capsys.readouterr().err


@pytest.mark.parametrize("flag, value, message", [
    ("--clip-eps-high", "-0.1", "--clip-eps-high must be >= 0 (0 = the same as --clip-eps), got -0.1"),
    ("--clip-eps-high", "nan", "--clip-eps-high must be >= 0"),
    ("--entropy-coef", "-0.01", "--entropy-coef must be >= 0"),
    ("--entropy-coef", "nan", "--entropy-coef must be >= 0"),
])
def test_bad_values_are_refused_in_one_line(headed, tmp_path, capsys, flag, value, message):
    run = tmp_path / "run"
    assert main(_rl(headed, run, flag, value)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not run.exists()
