"""Means with 95% intervals over a few seeds (Student's t: the right width for 3-10 runs).

    mean, low, high = mean_interval([0.71, 0.68, 0.74])
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from bebop.errors import BebopError

# two-sided 95% quantiles of Student's t by degrees of freedom (1..30); above, the normal's
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]
Z975 = 1.959964


def t_quantile(df: int) -> float:
    if df < 1:
        raise BebopError(f"an interval needs at least 2 values (1 degree of freedom), got {df + 1}")
    return T975[df - 1] if df <= len(T975) else Z975


def mean_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): the 95% t-interval of the mean; low = high = mean for a single value."""
    n = len(values)
    if n == 0:
        raise BebopError("mean_interval of no values")
    mean = sum(values) / n
    if n == 1:
        return mean, mean, mean
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half
