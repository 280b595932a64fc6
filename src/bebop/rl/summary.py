"""The numbers of the summary `bebop rl` prints at the end (train_rl returns it): the run's last steps.

Each is named KEY_mean_last5: KEY as RUN_DIR/metrics.jsonl names the per-step value, then what was done to
it, the mean over the run's last WINDOW steps (all of them when it has fewer), read back from metrics.jsonl
so that a resumed run's summary covers the steps before the resume too. Rounded to SIGNIFICANT digits: a
mean of a few noisy steps has no more to say (metrics.jsonl keeps every step unrounded).
"""

from __future__ import annotations

from collections.abc import Sequence

WINDOW = 5
SIGNIFICANT = 4
KEYS = ("reward", "mean_acceptance_length")  # metrics.jsonl keys


def rounded(x: float) -> float:
    return float(f"{x:.{SIGNIFICANT}g}")


def last_steps_means(rows: Sequence[dict]) -> dict[str, float | None]:
    """{KEY_mean_last5: the mean of KEY over the last WINDOW rows of metrics.jsonl} (None without rows)."""
    tail = rows[-WINDOW:]
    return {f"{key}_mean_last{WINDOW}": rounded(sum(r[key] for r in tail) / len(tail)) if tail else None
            for key in KEYS}
