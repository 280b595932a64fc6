"""95% intervals: means over a few seeds (Student's t: the right width for 3-10 runs), and ratios over
clusters (sequences whose positions are not independent).

    mean, low, high = mean_interval([0.71, 0.68, 0.74])
    t95(4)                                              # 2.776: the two-sided 95% quantile of t(4)
    se = cluster_ratio_se(accepted_per_seq, drafts_per_seq)   # of sum(accepted) / sum(drafts)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from bebop.errors import BebopError

Z95 = 1.959964  # two-sided 95% quantile of the normal


@lru_cache(maxsize=None)
def t95(df: int) -> float:
    """The two-sided 95% quantile of Student's t with `df` degrees of freedom (scipy's, exact for any df)."""
    if df < 1:
        raise BebopError(f"an interval needs at least 2 values (1 degree of freedom), got {df + 1}")
    from scipy.stats import t  # imported here: scipy.stats takes a second to import

    return float(t.ppf(0.975, df))


def mean_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): the 95% t-interval of the mean; low = high = mean for a single value."""
    n = len(values)
    if n == 0:
        raise BebopError("mean_interval of no values")
    mean = sum(values) / n
    if n == 1:
        return mean, mean, mean
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t95(n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def cluster_ratio_se(num: np.ndarray, den: np.ndarray) -> float | None:
    """The standard error of sum(num) / sum(den), num and den (C,) summed per cluster, by the delta method
    with the clusters as the independent units (the positions inside one are not); None for fewer than 2
    clusters or no denominator."""
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    n, total = len(num), float(den.sum())
    if n < 2 or total <= 0:
        return None
    value = float(num.sum()) / total
    return math.sqrt(float(((num - value * den) ** 2).sum()) / (n * (n - 1))) / (total / n)
