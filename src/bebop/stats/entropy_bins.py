"""The entropy law per token (docs/method.md section 5): every verified draft's acceptance against
the target's entropy at its position, in quantile bins with 95% intervals, and the fitted slope
with a bootstrap interval.

    log = metrics.draft_log                            # [(depth, H(p_depth) nats, accepted, sequence)]
                                                       # (accepted: 0/1, or an expected acceptance in [0, 1])
    bins = entropy_bins(log, depths=3, bins=10)        # quantile bins of H over the whole curve
    fit = acceptance_slope(log, depth=1)               # d P(accept) / dH at depth 1, with its interval

A record's fourth field, when given, is the id of the sequence it was drafted in (an int):
the drafts of one sequence are not independent (a prompt the head knows is accepted all along), so the
intervals then take the sequences as the independent units. Without it every draft is its own unit.

A bin row: its entropy range and mean, and per depth the drafts that reached it, how many were
accepted, the rate and its 95% Wilson interval; with sequences, the Wilson interval of the effective
count (the drafts divided by the design effect: the variance of the rate over sequences as clusters,
bebop.stats.intervals.cluster_ratio_se, over the binomial one, at least 1). The slope is ordinary least
squares of the acceptance of every depth-`depth` draft on its entropy: per token, so its unit is
acceptance probability per nat (the paper's slopes are in accept length per nat over RL steps or
temperatures; compare ratios between heads and rules, not the raw numbers). Its interval resamples
whole sequences (or drafts, without sequence ids): a percentile bootstrap, seeded (the same log gives
the same interval).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from bebop.errors import BebopError
from bebop.stats.intervals import Z95, cluster_ratio_se

RESAMPLES = 400
CHUNK = 50  # resamples per matrix product (memory: CHUNK x sequences counts)

Draft = tuple[int, float, float] | tuple[int, float, float, int]  # (depth, entropy, accepted[, sequence])


class Drafts(NamedTuple):
    depth: np.ndarray  # (N,) int
    entropy: np.ndarray  # (N,) nats
    accepted: np.ndarray  # (N,) 0/1, or an expected acceptance
    cluster: np.ndarray  # (N,) 0..C-1: the record's sequence, or its own index without sequence ids
    clustered: bool  # the log gave sequence ids

    def where(self, sel: np.ndarray) -> "Drafts":
        _, cluster = np.unique(self.cluster[sel], return_inverse=True)
        return Drafts(self.depth[sel], self.entropy[sel], self.accepted[sel], cluster, self.clustered)


def wilson(accepted: float, n: float, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a binomial rate (0, 1 for n = 0); n may be an effective count."""
    if n == 0:
        return 0.0, 1.0
    p = accepted / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _arrays(log: Sequence[Draft]) -> Drafts:
    if not log:
        raise BebopError("no verified drafts to bin (was the run made with log_drafts / --entropy-bins?)")
    widths = {len(record) for record in log}
    if not widths <= {3, 4} or len(widths) != 1:
        raise BebopError(f"draft records must all be (depth, entropy, accepted[, sequence]), got lengths {widths}")
    cols = [np.asarray(col) for col in zip(*log)]
    clustered = len(cols) == 4
    _, cluster = np.unique(cols[3], return_inverse=True) if clustered else (None, np.arange(len(log)))
    return Drafts(cols[0].astype(int), cols[1].astype(float), cols[2].astype(float), cluster, clustered)


def _rate_interval(drafts: Drafts) -> tuple[float, float]:
    """The 95% interval of the drafts' acceptance rate (Wilson; with sequences, of the effective count)."""
    n, total = len(drafts.accepted), float(drafts.accepted.sum())
    if not drafts.clustered or n == 0:
        return wilson(total, n)
    p = total / n
    se = cluster_ratio_se(np.bincount(drafts.cluster, weights=drafts.accepted), np.bincount(drafts.cluster))
    binomial = p * (1 - p) / n
    design = max(1.0, se * se / binomial) if se is not None and binomial > 0 else 1.0
    return wilson(total / design, n / design)


def entropy_bins(log: Sequence[Draft], depths: int, bins: int = 10) -> list[dict]:
    """Quantile bins of the target entropy over every draft of the curve, acceptance per depth in each."""
    if bins < 1:
        raise BebopError(f"entropy bins must be >= 1, got {bins}")
    drafts = _arrays(log)
    entropy = drafts.entropy
    edges = np.unique(np.quantile(entropy, np.linspace(0.0, 1.0, bins + 1)))  # ties collapse bins
    which = np.clip(np.searchsorted(edges, entropy, side="right") - 1, 0, max(len(edges) - 2, 0))  # (N,)
    rows = []
    for b in range(max(len(edges) - 1, 1)):
        inside = which == b
        per_depth = []
        for d in range(1, depths + 1):
            cell = drafts.where(inside & (drafts.depth == d))
            n, total = len(cell.accepted), float(cell.accepted.sum())
            acc = int(total) if total.is_integer() else total  # a count, or expected acceptances (diagnose)
            low, high = _rate_interval(cell)
            per_depth.append({"depth": d, "reached": n, "accepted": acc, "rate": acc / n if n else None,
                              "low": low, "high": high})
        rows.append({"lo": float(edges[b]), "hi": float(edges[min(b + 1, len(edges) - 1)]),
                     "mean_entropy": float(entropy[inside].mean()) if inside.any() else None,
                     "n": int(inside.sum()), "per_depth": per_depth})
    return rows


def _ols_slope(x: np.ndarray, y: np.ndarray) -> float:
    sxx = float(((x - x.mean()) ** 2).sum())
    return float(((x - x.mean()) * (y - y.mean())).sum() / sxx) if sxx > 0 else float("nan")


def _bootstrap_slopes(drafts: Drafts, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(R,) OLS slopes of resamples that draw whole clusters with replacement, from per-cluster sums."""
    x = drafts.entropy - drafts.entropy.mean()  # centred: the sums below keep their precision
    y, cluster = drafts.accepted, drafts.cluster
    clusters = int(cluster.max()) + 1
    sums = np.stack([np.bincount(cluster, weights=w, minlength=clusters)
                     for w in (np.ones_like(x), x, y, x * x, x * y)], axis=1)  # (C, 5): n, Sx, Sy, Sxx, Sxy
    out = []
    for start in range(0, resamples, CHUNK):
        r = min(CHUNK, resamples - start)
        draws = rng.integers(0, clusters, size=(r, clusters))  # (r, C) resampled cluster indices
        flat = (draws + clusters * np.arange(r)[:, None]).ravel()
        counts = np.bincount(flat, minlength=r * clusters).reshape(r, clusters)  # (r, C) times drawn
        n, sx, sy, sxx, sxy = (counts @ sums).T  # (r,) each
        with np.errstate(divide="ignore", invalid="ignore"):
            out.append((sxy - sx * sy / n) / (sxx - sx * sx / n))
    return np.concatenate(out)


def acceptance_slope(log: Sequence[Draft], depth: int = 1, resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """OLS slope of P(accept) on entropy over the depth-`depth` drafts, with a 95% bootstrap interval
    that resamples sequences (drafts, without sequence ids); "clusters": how many units it resampled."""
    drafts = _arrays(log)
    drafts = drafts.where(drafts.depth == depth)
    x, y = drafts.entropy, drafts.accepted
    if len(x) < 3 or float(x.std()) == 0.0:
        raise BebopError(f"the entropy law needs >= 3 depth-{depth} drafts with different entropies, got {len(x)}")
    boot = _bootstrap_slopes(drafts, resamples, np.random.default_rng(seed))
    boot = boot[np.isfinite(boot)]
    slope = _ols_slope(x, y)
    return {"depth": depth, "slope": slope, "intercept": float(y.mean() - slope * x.mean()),
            "low": float(np.quantile(boot, 0.025)), "high": float(np.quantile(boot, 0.975)), "n": int(len(x)),
            "clusters": int(drafts.cluster.max()) + 1}


def per_token_law(log: Sequence[Draft], depths: int, bins: int) -> dict:
    """{"entropy_bins": [...], "first_draft_slope": {...} or None when the drafts cannot give one}."""
    try:
        slope: dict | None = acceptance_slope(log, depth=1)
    except BebopError:  # too few depth-1 drafts, or all at one entropy (greedy targets)
        slope = None
    return {"entropy_bins": entropy_bins(log, depths, bins), "first_draft_slope": slope}
