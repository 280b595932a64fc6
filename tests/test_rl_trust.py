"""RL signals that mean what they say: the clip acts with more than one optimizer step per batch,
async with --max-staleness 0 waits instead of dropping (== sync), the drafter alarm, the trainer's
log-probs under the sampler's warping, and the metrics that were computed and dropped."""


import pytest
import torch
from torch import nn

from bebop.engine.adaptive import PROBE_EVERY, AdaptiveK
from bebop.engine.metrics import SpecMetrics
from bebop.engine.step_costs import StepCosts
from bebop.errors import BebopError
from bebop.rl import train_rl
from bebop.rl.async_loop import AsyncSource
from bebop.rl.drafter_alarm import CLEARED, RAISED, DrafterAlarm
from bebop.rl.grpo import GRPOLossInputs, grpo_loss, token_logprobs
from bebop.rl.loop import step_metrics
from bebop.rl.records import Rollout, RolloutBatch
from bebop.rl.source import Fetched
from bebop.rl.sync_source import SyncSource
from bebop.rl.trainer import PolicyTrainer, TrainStats
from bebop.sampling import SamplingParams, warp_probs

from rl_helpers import GatedSampler, read_metrics, rl_cfg

TIMING = {"rollout_s", "wait_s", "train_s", "step_s", "tokens_per_s"}


# 1. the clip acts

def test_clip_acts_only_with_more_than_one_optimizer_step(headed, tmp_path, digit_reward):
    one = read_metrics(_run(tmp_path / "one", rl_cfg(headed, steps=3)))
    assert all(r["clip_frac"] == 0.0 and r["optimizer_steps"] == 1 for r in one)  # ratio == 1 by construction
    for name, kw in [("epochs", dict(ppo_epochs=2)), ("minibatches", dict(mini_batches=2))]:
        rows = read_metrics(_run(tmp_path / name, rl_cfg(headed, steps=3, lr=1e-2, **kw)))
        assert all(r["optimizer_steps"] == 2 for r in rows)
        assert any(r["clip_frac"] > 0 for r in rows), name


def _run(path, cfg):
    train_rl(path, cfg, progress=False)
    return path


def test_bad_update_counts(headed, tmp_path):
    with pytest.raises(BebopError, match="ppo-epochs"):
        train_rl(tmp_path / "a", rl_cfg(headed, ppo_epochs=0), progress=False)
    with pytest.raises(BebopError, match="mini-batches 5 is more than the 4 rollouts"):
        train_rl(tmp_path / "b", rl_cfg(headed, mini_batches=5), progress=False)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# 2. async with max_staleness 0 waits for the publish

def test_async_staleness_zero_samples_only_after_the_publish():
    sampler = GatedSampler()
    for event in sampler.release:  # batches return as soon as they start: only the source can hold them
        event.set()
    model = nn.Linear(2, 2)
    source = AsyncSource(sampler, model, start_index=0, policy_version=0, max_staleness=0)
    try:
        first = source.next_batch(0)
        assert (first.batch.index, first.batch.policy_version) == (0, 0)
        assert not sampler.started[1].wait(0.3)  # batch 1 needs version 1: the worker waits
        source.publish(model, 1)
        fetched = source.next_batch(1)
        assert (fetched.batch.index, fetched.batch.policy_version, fetched.dropped) == (1, 1, 0)
    finally:
        source.close()


def test_async_staleness_zero_gives_the_metrics_of_sync(headed, tmp_path, digit_reward):
    sync = read_metrics(_run(tmp_path / "sync", rl_cfg(headed, steps=3)))
    lockstep = read_metrics(_run(tmp_path / "async", rl_cfg(headed, steps=3, mode="async", max_staleness=0)))
    assert [r["dropped"] for r in lockstep] == [0, 0, 0]
    for a, b in zip(sync, lockstep):
        assert {k: v for k, v in a.items() if k not in TIMING} == {k: v for k, v in b.items() if k not in TIMING}


# 3. the drafter alarm

def _spec(first_rate: float, drafts: int = 100) -> SpecMetrics:
    spec = SpecMetrics(2)
    for i in range(drafts):
        spec.record_draft(1 if i < first_rate * drafts else 0, 2)
    return spec


def test_drafter_alarm_baseline_patience_and_recovery():
    alarm = DrafterAlarm(baseline_steps=2, fraction=0.5, patience=2)
    assert [alarm.observe(_spec(r)) for r in (0.8, 0.6)] == [None, None]
    assert alarm.baseline == pytest.approx(0.7)
    assert alarm.observe(None) is None and alarm.observe(SpecMetrics(2)) is None  # no drafts: no evidence
    assert alarm.observe(_spec(0.3)) is None and not alarm.raised  # one low step is not enough
    assert alarm.observe(_spec(0.5)) is None and alarm.low_streak == 0  # back above 0.35: streak reset
    assert [alarm.observe(_spec(0.1)), alarm.observe(_spec(0.0))] == [None, RAISED]
    assert alarm.observe(_spec(0.2)) is None and alarm.raised
    assert alarm.observe(_spec(0.6)) == CLEARED and not alarm.raised


def test_suspended_controller_drafts_only_to_probe():
    costs = StepCosts({(1, 1): 1.0, (1, 2): 1.0, (1, 3): 1.0}, {1: 0.01}, max_k=2)
    policy = AdaptiveK(2, costs)
    for k in (0, 2):  # both kinds measured: drafting is clearly better here
        policy.observe(1, k, 1.0 + 0.01 * k, [2] if k else [])
    assert policy.choose(1) > 0
    policy.suspended = True
    chosen = []
    for _ in range(3 * PROBE_EVERY):
        k = policy.choose(1)
        chosen.append(k)
        policy.observe(1, k, 1.0, [2] if k else [])
    assert 1 <= sum(k > 0 for k in chosen) <= 3  # a probe about every PROBE_EVERY steps, else plain


class FixedCosts(StepCosts):
    """A cost model that does not read the clock: --k auto's choices then depend on acceptance only,
    so these runs are the same on a busy machine."""

    def observe(self, rows: int, k: int, seconds: float | None) -> None:
        super().observe(rows, k, self.profiled(rows, k))  # measured exactly as profiled: every level 0


@pytest.fixture()
def fixed_costs(monkeypatch):
    trunk = {(rows, t): 1.0 + 0.02 * t for rows in (1, 8) for t in range(1, 8)}
    monkeypatch.setattr("bebop.engine.step_costs.step_costs", lambda model, max_rows, max_k, **_: FixedCosts(
        trunk, {1: 0.05, 8: 0.05}, max_k))


class CorruptingTrainer(PolicyTrainer):
    """After its 4th update, the draft head's output norm is scaled by 1000: the drafts become
    confident random tokens (a head broken by a bad weight sync)."""

    def step(self, rollouts):
        stats = super().step(rollouts)
        if self.policy_version == 4:
            with torch.no_grad():
                self.policy.model.mtp.norm.weight.mul_(1e3)
        return stats


def _drafted(row) -> bool:
    return any(int(k) > 0 for counts in row["k_histogram"].values() for k in counts) or not row["k_histogram"]


@pytest.mark.parametrize("k,steps", [(2, 7), ("auto", 10)])
def test_a_broken_head_raises_the_alarm(headed, tmp_path, monkeypatch, capsys, fixed_costs, k, steps):
    monkeypatch.setattr("bebop.rl.loop.PolicyTrainer", CorruptingTrainer)
    suspended = []
    monkeypatch.setattr(SyncSource, "suspend_drafting", lambda self, flag: suspended.append(flag))
    rows = read_metrics(_run(tmp_path / "run", rl_cfg(headed, spec="rs", k=k, steps=steps, batch_prompts=4)))
    rates = [r["acceptance_rate_per_position"][0] for r in rows]
    drafted = [_drafted(r) for r in rows]
    assert min(x for x, d in zip(rates[:4], drafted) if d) > 2 * max(rates[4:]), rates  # the corruption works
    alarms = [r["drafter_alarm"] for r in rows]
    if k == 2:  # every step drafts: 3 baseline steps, the corruption after step 4, 3 low steps in a row
        assert alarms == [False] * 6 + [True]
    else:  # --k auto drafts less once acceptance falls (a probe now and then): later, but raised
        assert not any(alarms[:6]) and alarms[-1], (alarms, drafted)
    assert capsys.readouterr().err.count("drafter alarm") == 1
    assert suspended == ([True] if k == "auto" else [])  # only --k auto stops drafting


class HealingTrainer(CorruptingTrainer):
    """... and after its 9th update the head is mended (a later weight sync that works)."""

    def step(self, rollouts):
        stats = super().step(rollouts)
        if self.policy_version == 9:
            with torch.no_grad():
                self.policy.model.mtp.norm.weight.div_(1e3)
        return stats


def test_with_k_auto_drafting_resumes_when_the_head_recovers(headed, tmp_path, monkeypatch, fixed_costs):
    monkeypatch.setattr("bebop.rl.loop.PolicyTrainer", HealingTrainer)
    calls = []
    suspend = SyncSource.suspend_drafting
    monkeypatch.setattr(SyncSource, "suspend_drafting", lambda self, flag: (calls.append(flag), suspend(self, flag)))
    rows = read_metrics(_run(tmp_path / "run", rl_cfg(headed, spec="rs", k="auto", steps=16, batch_prompts=4)))
    alarms = [r["drafter_alarm"] for r in rows]
    assert calls == [True, False], alarms  # stopped drafting, then resumed
    assert alarms[-1] is False and any(alarms[6:9])


# 4. warping: the trainer's log-probs are the sampler's

@pytest.mark.parametrize("sampling", [SamplingParams(0.7, top_k=5), SamplingParams(1.3, top_p=0.6),
                                      SamplingParams(1.0, top_k=8, top_p=0.8)])
def test_trainer_logprobs_are_the_samplers_under_warping(sampling):
    logits = torch.randn(2, 6, 40, generator=torch.Generator().manual_seed(0)) * 3
    probs = warp_probs(logits, sampling)  # the engine's distribution
    tokens = torch.multinomial(probs.view(-1, 40), 1, generator=torch.Generator().manual_seed(1)).view(2, 6)
    picked, entropy = token_logprobs(logits, tokens, sampling)
    expected = probs.gather(-1, tokens[..., None])[..., 0].log()
    torch.testing.assert_close(picked, expected, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(entropy).all()


def test_a_token_outside_the_trainers_set_has_zero_weight_and_no_nan():
    sampling = SamplingParams(1.0, top_k=2)
    logits = torch.tensor([[[5.0, 4.0, 0.0, -1.0]]], requires_grad=True)
    lp, _ = token_logprobs(logits, torch.tensor([[2]]), sampling)  # token 2 is outside the top 2
    out = grpo_loss(GRPOLossInputs(lp, lp.detach(), torch.tensor([[-1.0]]), torch.tensor([1.0]),
                                   torch.tensor([[True]])), clip_eps=0.2)
    out.loss.backward()
    assert out.is_weight_mean == 0.0 and torch.isfinite(logits.grad).all()


def test_with_top_k_the_on_policy_importance_weight_is_one(headed, tmp_path, digit_reward):
    rows = read_metrics(_run(tmp_path / "run", rl_cfg(headed, steps=2, top_k=5, top_p=0.9)))
    assert all(r["is_weight_mean"] == pytest.approx(1.0, abs=1e-3) for r in rows)


# 5. metrics that were computed and dropped

def test_step_metrics_carry_the_loss_terms_and_the_cut_responses():
    rollouts = [Rollout([1], [5] * n, [0.0] * n, [True] * n, 0.0, 0, truncated=cut)
                for n, cut in [(4, False), (8, True), (2, False), (8, True)]]
    batch = RolloutBatch(rollouts, 2, 0, 0, 1.0, None, 0.0, 0.0)
    stats = TrainStats(loss=0.5, pg_loss=0.4, kl=0.1, clip_frac=0.25, is_weight_mean=0.9, is_truncated_frac=0.125, sampler_kl=0.0,
                       train_entropy=1.0, grad_norm=2.0, optimizer_steps=2)
    m = step_metrics(1, Fetched(batch, 0, 0.0), stats, 0, None, 1.0, 2.0, False)
    assert (m.pg_loss, m.is_truncated_frac, m.clip_frac, m.optimizer_steps) == (0.4, 0.125, 0.25, 2)
    assert (m.truncated_frac, m.response_len_mean, m.response_len_max) == (0.5, 5.5, 8)
