"""What one RL step records (RUN_DIR/metrics.jsonl, written by bebop.metrics_log.MetricsLog):
`StepMetrics`, and the response-length percentiles it carries."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from bebop.errors import BebopError

METRICS_FILE = "metrics.jsonl"


@dataclass
class StepMetrics:
    step: int  # 1-based: the number of policy updates done after this step
    policy_version: int  # version of the weights that sampled the batch trained on
    staleness: int  # trainer version at training time - policy_version
    dropped: int  # batches dropped as too stale before this one (async)
    reward: float
    pass_rate: float
    reward_errors: int  # rewards that raised or returned no finite number: scored 0 (reported on stderr)
    entropy: float | None  # sampler entropy over policy tokens (nats); None: the engine reports none (vLLM)
    train_entropy: float  # trainer entropy at the same temperature
    mean_acceptance_length: float  # 1.0 without drafting (one token per target forward)
    acceptance_rate: float | None  # None without drafting
    acceptance_rate_per_position: list[float] = field(default_factory=list)
    k_histogram: dict = field(default_factory=dict)  # {live-batch range: {k: steps}} (engine metrics)
    drafts_by_source: dict = field(default_factory=dict)  # {drafter: {num_drafts, mean_acceptance_length}}
    rollout_s: float = 0.0
    wait_s: float = 0.0  # trainer time spent waiting for the batch (async: < rollout_s when overlapped)
    train_s: float = 0.0
    step_s: float = 0.0
    generated_tokens: int = 0  # policy tokens sampled in the batch
    tokens_per_s: float = 0.0  # generated_tokens / rollout_s
    response_len_p50: float = 0.0  # response length: policy tokens of one rollout (stop token in,
    response_len_p90: float = 0.0  # environment observations out); percentiles over the batch,
    response_len_max: int = 0  # see length_percentiles: long tails show as p90 and max >> p50
    response_len_mean: float = 0.0
    truncated_frac: float = 0.0  # share of responses cut by max_new_tokens (or the context) before a stop
    loss: float = 0.0
    pg_loss: float = 0.0  # the clipped surrogate alone (loss = pg_loss + kl_coef * kl - entropy_coef * H, H the
    # entropy of the update's forwards: train_entropy with one optimizer step, the default)
    kl: float = 0.0
    clip_frac: float = 0.0  # share of policy tokens whose PPO ratio was clipped (0 with one optimizer step)
    is_weight_mean: float = 1.0
    is_truncated_frac: float = 0.0  # share of policy tokens whose importance weight hit is_cap
    sampler_kl: float = 0.0  # k3 KL(sampler || trainer) over policy tokens (--rollout-dtype bfloat16: > 0)
    optimizer_steps: int = 1  # ppo_epochs x mini_batches
    drafter_alarm: bool = False  # the head's acceptance fell below its baseline (rl/drafter_alarm.py)
    grad_norm: float = 0.0
    mtp_loss: float | None = None
    mtp_acceptance_per_depth: list[float] = field(default_factory=list)
    eval_reward: float | None = None  # mean reward on --eval-data, at the steps it is evaluated (else None)
    eval_pass_rate: float | None = None


def percentile(ordered: Sequence[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) of sorted values, linear between ranks (numpy's default)."""
    if not ordered:
        raise BebopError("percentile of no values")
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


class LengthPercentiles(TypedDict):
    response_len_p50: float
    response_len_p90: float
    response_len_max: int
    response_len_mean: float


def length_percentiles(lengths: Sequence[int]) -> LengthPercentiles:
    """The batch's response_len_p50 / _p90 / _max / _mean from per-response lengths (zeros when empty)."""
    if not lengths:
        return {"response_len_p50": 0.0, "response_len_p90": 0.0, "response_len_max": 0, "response_len_mean": 0.0}
    ordered = sorted(lengths)
    return {"response_len_p50": float(percentile(ordered, 0.5)), "response_len_p90": float(percentile(ordered, 0.9)),
            "response_len_max": ordered[-1], "response_len_mean": sum(ordered) / len(ordered)}
