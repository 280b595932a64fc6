"""Per-step response-length metrics: p50 / p90 / max of policy tokens per rollout, on a known batch."""

import dataclasses

import pytest

from bebop.errors import BebopError
from bebop.rl.loop import step_metrics
from bebop.rl.metrics import length_percentiles, percentile
from bebop.rl.records import Rollout, RolloutBatch
from bebop.rl.source import Fetched
from bebop.rl.trainer import TrainStats


def rollout(n_policy: int, n_env: int = 0) -> Rollout:
    """n_policy sampled tokens, then n_env environment tokens (never counted as response length)."""
    mask = [True] * n_policy + [False] * n_env
    return Rollout([1, 2], [7] * len(mask), [0.0] * len(mask), mask, reward=1.0, policy_version=0)


def test_percentiles_interpolate_between_ranks():
    assert percentile([1, 2, 3, 4], 0.5) == 2.5
    assert percentile([10], 0.9) == 10
    assert percentile(list(range(1, 11)), 0.9) == pytest.approx(9.1)
    with pytest.raises(BebopError, match="no values"):
        percentile([], 0.5)


def test_length_percentiles_on_a_long_tail():
    lengths = [10] * 8 + [100, 300]  # most short, two long
    assert length_percentiles(lengths) == {"response_len_p50": 10.0, "response_len_p90": pytest.approx(120.0),
                                           "response_len_max": 300, "response_len_mean": 48.0}
    assert length_percentiles([]) == {"response_len_p50": 0.0, "response_len_p90": 0.0, "response_len_max": 0,
                                      "response_len_mean": 0.0}


def test_step_metrics_log_response_lengths_in_policy_tokens():
    rollouts = [rollout(n) for n in (5, 5, 5, 5, 5, 5, 5, 20)] + [rollout(12, n_env=40), rollout(40)]
    batch = RolloutBatch(rollouts, 2, 0, 0, 1.0, None, 1.0, 0.5)
    stats = TrainStats(loss=0.0, pg_loss=0.0, kl=0.0, clip_frac=0.0, is_weight_mean=1.0, is_truncated_frac=0.0, sampler_kl=0.0,
                       train_entropy=0.5, grad_norm=0.1, optimizer_steps=1)
    m = step_metrics(1, Fetched(batch, 0, 0.0), stats, 0, None, 0.1, 1.0, False)
    row = dataclasses.asdict(m)
    # sorted policy lengths: 5 x7, 12, 20, 40 -> p50 = 5, p90 = 20 + 0.1 * 20 = 22, max 40
    assert (row["response_len_p50"], row["response_len_p90"], row["response_len_max"]) == pytest.approx((5.0, 22.0, 40))
    assert row["generated_tokens"] == 5 * 7 + 20 + 12 + 40
