"""RL loop: one sync and one async step end to end, staleness drop, weight sync carries the head
(acceptance after sync == a fresh load), online MTP never touches the trunk, bad input."""

import copy
import json

import pytest
import torch
from torch import nn

from bebop.engine.speculative import speculative_generate
from bebop.errors import BebopError
from bebop.model import load_model
from bebop.model.checkpoint import save_model
from bebop.policy import load_policy
from bebop.rl import train_rl
from bebop.rl.async_loop import AsyncSource
from bebop.rl.mtp_online import make_online_mtp
from bebop.rl.sampler import RolloutSampler
from bebop.rl.source import snapshot
from bebop.rl.trainer import PolicyTrainer
from bebop.sampling import SamplingParams
from bebop.tasks import get_task

from rl_helpers import GatedSampler, read_metrics, rl_cfg

METRIC_KEYS = {"step", "reward", "pass_rate", "entropy", "mean_acceptance_length", "acceptance_rate_per_position",
               "rollout_s", "train_s", "step_s", "generated_tokens", "tokens_per_s", "staleness", "policy_version",
               "dropped", "mtp_loss", "response_len_p50", "response_len_p90", "response_len_max", "response_len_mean",
               "truncated_frac", "pg_loss", "is_truncated_frac", "optimizer_steps", "drafter_alarm"}


@pytest.mark.parametrize("mode,spec,mtp", [("sync", "rs", "tv"), ("async", "to", "none")])
def test_steps_run_end_to_end_and_write_metrics(headed, tmp_path, digit_reward, mode, spec, mtp):
    run = tmp_path / "run"
    summary = train_rl(run, rl_cfg(headed, mode=mode, spec=spec, k=2, mtp_update=mtp, steps=3, batch_prompts=4),
                       progress=False)
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert METRIC_KEYS <= set(r)
        per_position = r["acceptance_rate_per_position"]
        assert len(per_position) == 2 and per_position[0] >= per_position[1]  # depth 2 needs depth 1
        assert r["mean_acceptance_length"] == pytest.approx(1 + sum(per_position))  # tokens per verify, <= K+1
        assert r["generated_tokens"] > 0 and r["rollout_s"] > 0
        assert 0 < r["response_len_p50"] <= r["response_len_p90"] <= r["response_len_max"] <= 16
        assert 0 <= r["staleness"] <= 1
        assert (r["mtp_loss"] is None) == (mtp == "none")
    # the digit reward gives nonzero advantages unless every group of 2 scores alike: each one does with
    # probability ~1/2 on this random policy, all 12 of them about 2e-4 (4 prompts a step, 3 steps)
    assert any(r["grad_norm"] > 0 for r in rows)
    if mode == "sync":
        assert [r["policy_version"] for r in rows] == [0, 1, 2] and all(r["staleness"] == 0 for r in rows)
    assert summary["policy_version"] == 3
    assert json.loads((run / "config.json").read_text())["mode"] == mode
    final = load_model(run / "model")
    assert final.mtp is not None
    start = load_model(headed)
    changed = {n for n, t in start.state_dict().items() if not torch.equal(t, final.state_dict()[n])}
    assert any(not n.startswith("mtp.") for n in changed)  # the policy moved
    assert any(n.startswith("mtp.") for n in changed) == (mtp != "none")  # the head only with online MTP


def test_async_drops_batches_older_than_max_staleness():
    sampler = GatedSampler()
    model = nn.Linear(2, 2)
    source = AsyncSource(sampler, model, start_index=0, policy_version=0, max_staleness=1)
    try:
        sampler.release[0].set()
        first = source.next_batch(0)
        assert (first.batch.index, first.batch.policy_version, first.dropped) == (0, 0, 0)
        assert sampler.started[1].wait(10)  # the worker samples batch 1 with version 0 ...
        source.publish(model, 1)  # ... while the trainer makes two updates
        source.publish(model, 2)
        sampler.release[1].set()
        sampler.release[2].set()
        fetched = source.next_batch(2)  # batch 1 is 2 versions old > 1: dropped; batch 2 was sampled at v2
        assert (fetched.batch.index, fetched.batch.policy_version, fetched.dropped) == (2, 2, 1)
        assert source.next_index == 3
    finally:
        for event in sampler.release:
            event.set()
        source.close()


def _spec_signature(model, temperature, mode):
    gens, metrics = speculative_generate(model, [[10, 11, 12, 13], [20, 21]], k=2, mode=mode, max_new_tokens=24,
                                         sampling=SamplingParams(temperature), generator=torch.Generator().manual_seed(0))
    return [g.token_ids for g in gens], metrics.to_dict()


def test_weight_sync_carries_the_head(headed, tmp_path):
    policy = load_policy(headed, device="cpu")
    cfg = rl_cfg(headed, spec="rs", k=2, batch_prompts=1)
    source = AsyncSource(RolloutSampler(get_task("math"), policy, cfg), policy.model, start_index=0,
                         policy_version=0, max_staleness=1)
    try:
        old_head = {k: v.clone() for k, v in policy.model.state_dict().items() if k.startswith("mtp.")}
        with torch.no_grad():  # the trainer moves trunk and head
            g = torch.Generator().manual_seed(1)
            for p in policy.model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
        source.publish(policy.model, 1)
        version = 0
        while version < 1:
            version = source.next_batch(1).batch.policy_version
    finally:
        source.close()
    save_model(policy.model, tmp_path / "fresh")
    fresh = load_model(tmp_path / "fresh")
    for temperature, mode in [(0.0, "to"), (1.0, "to"), (1.0, "rs")]:
        assert _spec_signature(source.rollout_model, temperature, mode) == _spec_signature(fresh, temperature, mode)
    # control: a rollout model whose head was not synced is told apart by the same comparison
    stale = copy.deepcopy(source.rollout_model)
    stale.load_state_dict(old_head, strict=False)
    assert _spec_signature(stale, 1.0, "rs") != _spec_signature(fresh, 1.0, "rs")


def _state_equal(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_state_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_state_equal(x, y) for x, y in zip(a, b))
    return a == b


def test_online_mtp_never_touches_the_trunk_and_grpo_never_touches_the_head(headed):
    policy = load_policy(headed, device="cpu")
    cfg = rl_cfg(headed, mtp_update="tv", k=2, mtp_lr=1e-2)
    batch = RolloutSampler(get_task("math"), policy, cfg).collect(policy.model, index=0, policy_version=0)
    for rollout, reward in zip(batch.rollouts, [1.0, 0.0, 0.0, 1.0]):
        rollout.reward = reward
    trainer = PolicyTrainer(policy, cfg)
    before = snapshot(policy.model)
    trainer.step(batch)
    after_grpo = snapshot(policy.model)
    for name, t in before.items():
        assert torch.equal(t, after_grpo[name]) == name.startswith("mtp."), name
    opt_state = copy.deepcopy(trainer.optimizer.state_dict())
    online = make_online_mtp(policy, cfg)
    stats = online.update(batch.rollouts)
    assert stats.num_chains > 0
    after_mtp = snapshot(policy.model)
    for name, t in after_grpo.items():
        assert torch.equal(t, after_mtp[name]) != name.startswith("mtp."), name
    for name, p in policy.model.named_parameters():
        if not name.startswith("mtp."):
            assert p.grad is None and p.requires_grad, name
    assert _state_equal(opt_state, trainer.optimizer.state_dict())


def test_bad_inputs(headed, tiny_model_dir, tmp_path):
    with pytest.raises(BebopError, match="group-size"):
        train_rl(tmp_path / "a", rl_cfg(headed, group_size=1), progress=False)
    with pytest.raises(BebopError, match="bebop mtp init"):
        train_rl(tmp_path / "b", rl_cfg(tiny_model_dir, spec="rs"), progress=False)
    with pytest.raises(BebopError, match="bebop mtp init"):
        train_rl(tmp_path / "b2", rl_cfg(tiny_model_dir, mtp_update="ce"), progress=False)
    with pytest.raises(BebopError, match="cannot express"):
        train_rl(tmp_path / "c", rl_cfg(_digits_only_tokenizer(tiny_model_dir, tmp_path / "digits")), progress=False)
    run = tmp_path / "run"
    train_rl(run, rl_cfg(headed, steps=1), progress=False)
    with pytest.raises(BebopError, match="already holds"):
        train_rl(run, rl_cfg(headed, steps=1), progress=False)
    with pytest.raises(BebopError, match=r"differs in clip_eps, lr$"):
        train_rl(run, rl_cfg(headed, steps=1, lr=5e-3, clip_eps=0.3), resume=True, progress=False)


def _digits_only_tokenizer(model_dir, out):
    """The model with a tokenizer that knows only digits: task prompts map to <unk>."""
    import shutil

    from tokenizers import Tokenizer, models

    from bebop.tokenizer import SPECIAL_TOKENS, save_tokenizer

    shutil.copytree(model_dir, out)
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in "0123456789":
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    save_tokenizer(tok, out)
    return out


def test_async_thread_split(headed, tmp_path, monkeypatch):
    """--rollout-threads / --train-threads: the worker and the trainer each run with their own
    torch thread count (per thread), and the caller's count is restored after the run."""
    seen = {"collect": [], "train": []}
    collect, train_step = RolloutSampler.collect, PolicyTrainer.step

    def recording_collect(self, *a, **kw):
        seen["collect"].append(torch.get_num_threads())
        return collect(self, *a, **kw)

    def recording_step(self, *a, **kw):
        seen["train"].append(torch.get_num_threads())
        return train_step(self, *a, **kw)

    monkeypatch.setattr(RolloutSampler, "collect", recording_collect)
    monkeypatch.setattr(PolicyTrainer, "step", recording_step)
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        train_rl(tmp_path / "run", rl_cfg(headed, mode="async", rollout_threads=1, train_threads=2), progress=False)
        assert set(seen["collect"]) == {1} and set(seen["train"]) == {2}
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_bad_thread_counts(headed, tmp_path):
    with pytest.raises(BebopError, match="threads"):
        train_rl(tmp_path / "run", rl_cfg(headed, mode="async", rollout_threads=-1), progress=False)
