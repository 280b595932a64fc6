"""bfloat16 rollouts (issue 24, part 4): `rl --rollout-dtype bfloat16` samples from a bfloat16 copy synced
from the float32 trainer every batch, whose mismatch the truncated importance weight corrects and
`sampler_kl` reports. Losslessness and T=0 in bfloat16: tests/test_speculative.py (its dtype_model)."""

from __future__ import annotations

import pytest
import torch

from bebop.cli import main
from bebop.policy import load_policy
from bebop.rl import train_rl
from bebop.rl.sampler import RolloutSampler
from bebop.tasks import get_task

from rl_helpers import read_metrics, rl_cfg


def test_the_sampler_runs_a_bf16_copy_synced_every_batch(headed):
    policy = load_policy(headed, device="cpu")
    sampler = RolloutSampler(get_task("math"), policy, rl_cfg(headed, rollout_dtype="bfloat16"))
    batch = sampler.collect(policy.model, index=0, policy_version=0)
    engine = sampler.rollout_copy
    assert engine is not None and engine.dtype == torch.bfloat16 and policy.model.dtype == torch.float32
    assert len(batch.rollouts) == 4
    with torch.no_grad():
        policy.model.model.norm.weight.add_(0.5)  # the trainer steps
    sampler.collect(policy.model, index=1, policy_version=1)
    assert sampler.rollout_copy is engine  # the same copy, its weights synced
    assert torch.equal(engine.model.norm.weight, policy.model.model.norm.weight.to(torch.bfloat16))
    assert RolloutSampler.__getstate__(sampler)["rollout_copy"] is None  # not shipped to Ray workers


def test_rl_with_bf16_rollouts_reports_the_mismatch_it_corrects(headed, tmp_path, digit_reward):
    base = dict(steps=2, spec="rs", k=2, max_new_tokens=16)
    train_rl(tmp_path / "bf16", rl_cfg(headed, rollout_dtype="bfloat16", **base), progress=False)
    train_rl(tmp_path / "fp32", rl_cfg(headed, **base), progress=False)
    bf16, fp32 = read_metrics(tmp_path / "bf16"), read_metrics(tmp_path / "fp32")
    assert all(m["sampler_kl"] > 1e-9 and m["is_weight_mean"] != 1.0 for m in bf16)
    assert all(abs(m["sampler_kl"]) < 1e-12 and m["is_weight_mean"] == pytest.approx(1.0, abs=1e-6) for m in fp32)
    assert min(m["sampler_kl"] for m in bf16) > 100 * max(abs(m["sampler_kl"]) for m in fp32)


def test_an_unknown_rollout_dtype_is_one_line_and_nothing_written(headed, tmp_path, capsys):
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        main(["rl", "--model", str(headed), "--task", "math", "--steps", "1", "--out", str(run),
              "--rollout-dtype", "float16"])
    assert exit_.value.code == 2 and not run.exists()
    assert "--rollout-dtype: invalid choice: 'float16'" in capsys.readouterr().err
