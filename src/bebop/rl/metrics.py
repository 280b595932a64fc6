"""Per-step RL metrics: RUN_DIR/metrics.jsonl (one object per step) and optional TensorBoard.

    writer = MetricsWriter(run_dir, resume_step=0, tensorboard=False)
    writer.write(step_metrics)       # appends one line, flushed
    writer.close()

On resume the file is first cut (atomically) to the steps <= the checkpoint's step, so a step
that ran after the last checkpoint and is run again is never counted twice; a line torn by a
kill is dropped too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypedDict

from bebop.errors import BebopError
from bebop.fileio import atomic_write_text

METRICS_FILE = "metrics.jsonl"


@dataclass
class StepMetrics:
    step: int  # 1-based: the number of policy updates done after this step
    policy_version: int  # version of the weights that sampled the batch trained on
    staleness: int  # trainer version at training time - policy_version
    dropped: int  # batches dropped as too stale before this one (async)
    reward: float
    pass_rate: float
    entropy: float  # sampler entropy over policy tokens (nats)
    train_entropy: float  # trainer entropy at the same temperature
    mean_acceptance_length: float  # 1.0 without drafting (one token per target forward)
    acceptance_rate: float | None  # None without drafting
    acceptance_rate_per_position: list[float] = field(default_factory=list)
    k_histogram: dict = field(default_factory=dict)  # {live-batch range: {k: steps}} (engine metrics)
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
    pg_loss: float = 0.0  # the clipped surrogate alone (loss = pg_loss + kl_coef * kl)
    kl: float = 0.0
    clip_frac: float = 0.0  # share of policy tokens whose PPO ratio was clipped (0 with one optimizer step)
    is_weight_mean: float = 1.0
    is_truncated_frac: float = 0.0  # share of policy tokens whose importance weight hit is_cap
    optimizer_steps: int = 1  # ppo_epochs x mini_batches
    drafter_alarm: bool = False  # the head's acceptance fell below its baseline (rl/drafter_alarm.py)
    grad_norm: float = 0.0
    mtp_loss: float | None = None
    mtp_acceptance_per_depth: list[float] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({k: round(v, 6) if isinstance(v, float) else v for k, v in asdict(self).items()})


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


def read_steps(path: Path, upto: int) -> list[str]:
    """The valid lines of `path` whose step is <= upto (torn or later lines dropped)."""
    if not path.is_file():
        return []
    kept = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= upto:
            kept.append(line)
    return kept


class MetricsWriter:
    def __init__(self, run_dir: str | Path, *, resume_step: int = 0, tensorboard: bool = False) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        kept = read_steps(self.path, resume_step)
        atomic_write_text(self.path, "".join(line + "\n" for line in kept))
        self.board = open_tensorboard(Path(run_dir) / "tb") if tensorboard else None
        self.fh = open(self.path, "a", encoding="utf-8")

    def write(self, m: StepMetrics) -> None:
        self.fh.write(m.to_json() + "\n")
        self.fh.flush()
        os.fsync(self.fh.fileno())
        if self.board is not None:
            for key, value in asdict(m).items():
                if isinstance(value, (int, float)) and key != "step":
                    self.board.add_scalar(f"rl/{key}", value, m.step)
                elif isinstance(value, list):
                    for i, v in enumerate(value):
                        self.board.add_scalar(f"rl/{key}/{i + 1}", v, m.step)

    def close(self) -> None:
        self.fh.close()
        if self.board is not None:
            self.board.close()


def require_tensorboard():
    """torch's SummaryWriter class, imported lazily; a clear error when tensorboard is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise BebopError("--tensorboard needs the tensorboard package (pip install tensorboard)") from None
    return SummaryWriter


def open_tensorboard(log_dir: Path):
    return require_tensorboard()(str(log_dir))
