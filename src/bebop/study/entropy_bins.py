"""The entropy law per token (docs/method.md section 5): every verified draft's acceptance against
the target's entropy at its position, in quantile bins with 95% intervals, and the fitted slope
with a bootstrap interval.

    log = metrics.draft_log                            # [(depth, H(p_depth) nats, accepted)], engine
                                                       # (accepted: 0/1, or an expected acceptance in [0, 1])
    bins = entropy_bins(log, depths=3, bins=10)        # quantile bins of H over the whole curve
    fit = acceptance_slope(log, depth=1)               # d P(accept) / dH at depth 1, with its interval

A bin row: its entropy range and mean, and per depth the drafts that reached it, how many were
accepted, the rate and its Wilson 95% interval. The slope is ordinary least squares of the 0/1
acceptance of every depth-`depth` draft on its entropy: per token, so its unit is acceptance
probability per nat (the paper's slopes are in accept length per nat over RL steps or temperatures;
compare ratios between heads and rules, not the raw numbers). Its interval resamples the drafts
(percentile bootstrap, seeded: the same log gives the same interval).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from bebop.errors import BebopError

Z95 = 1.959964  # two-sided 95% normal quantile
RESAMPLES = 400


def wilson(accepted: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a binomial rate (0, 1 for n = 0)."""
    if n == 0:
        return 0.0, 1.0
    p = accepted / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _arrays(log: Sequence[tuple[int, float, float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not log:
        raise BebopError("no verified drafts to bin (was the run made with log_drafts / --entropy-bins?)")
    depth, entropy, accepted = (np.asarray(col) for col in zip(*log))
    return depth.astype(int), entropy.astype(float), accepted.astype(float)  # 0/1, or an expected acceptance


def entropy_bins(log: Sequence[tuple[int, float, float]], depths: int, bins: int = 10) -> list[dict]:
    """Quantile bins of the target entropy over every draft of the curve, acceptance per depth in each."""
    if bins < 1:
        raise BebopError(f"entropy bins must be >= 1, got {bins}")
    depth, entropy, accepted = _arrays(log)
    edges = np.unique(np.quantile(entropy, np.linspace(0.0, 1.0, bins + 1)))  # ties collapse bins
    which = np.clip(np.searchsorted(edges, entropy, side="right") - 1, 0, max(len(edges) - 2, 0))  # (N,)
    rows = []
    for b in range(max(len(edges) - 1, 1)):
        inside = which == b
        per_depth = []
        for d in range(1, depths + 1):
            sel = inside & (depth == d)
            n, total = int(sel.sum()), float(accepted[sel].sum())
            acc = int(total) if total.is_integer() else total  # a count, or expected acceptances (diagnose)
            low, high = wilson(acc, n)
            per_depth.append({"depth": d, "reached": n, "accepted": acc, "rate": acc / n if n else None,
                              "low": low, "high": high})
        rows.append({"lo": float(edges[b]), "hi": float(edges[min(b + 1, len(edges) - 1)]),
                     "mean_entropy": float(entropy[inside].mean()) if inside.any() else None,
                     "n": int(inside.sum()), "per_depth": per_depth})
    return rows


def _ols_slope(x: np.ndarray, y: np.ndarray) -> float:
    sxx = float(((x - x.mean()) ** 2).sum())
    return float(((x - x.mean()) * (y - y.mean())).sum() / sxx) if sxx > 0 else float("nan")


def acceptance_slope(log: Sequence[tuple[int, float, float]], depth: int = 1, resamples: int = RESAMPLES,
                     seed: int = 0) -> dict:
    """OLS slope of P(accept) on entropy over the depth-`depth` drafts, with a 95% bootstrap interval."""
    depths, entropy, accepted = _arrays(log)
    sel = depths == depth
    x, y = entropy[sel], accepted[sel]
    if len(x) < 3 or float(x.std()) == 0.0:
        raise BebopError(f"the entropy law needs >= 3 depth-{depth} drafts with different entropies, got {len(x)}")
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(x), size=(resamples, len(x)))  # (R, N) resampled draft indices
    boot = np.array([_ols_slope(x[i], y[i]) for i in draws])
    boot = boot[np.isfinite(boot)]
    intercept = float(y.mean() - _ols_slope(x, y) * x.mean())
    return {"depth": depth, "slope": _ols_slope(x, y), "intercept": intercept,
            "low": float(np.quantile(boot, 0.025)), "high": float(np.quantile(boot, 0.975)), "n": int(len(x))}


def per_token_law(log: Sequence[tuple[int, float, float]], depths: int, bins: int) -> dict:
    """{"entropy_bins": [...], "first_draft_slope": {...} or None when the drafts cannot give one}."""
    try:
        slope: dict | None = acceptance_slope(log, depth=1)
    except BebopError:  # too few depth-1 drafts, or all at one entropy (greedy targets)
        slope = None
    return {"entropy_bins": entropy_bins(log, depths, bins), "first_draft_slope": slope}
