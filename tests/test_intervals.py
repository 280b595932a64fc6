"""95% t-intervals of a mean over a few seeds."""

import math

import pytest

from bebop.errors import BebopError
from bebop.stats.intervals import mean_interval, t95


def test_known_values():
    mean, low, high = mean_interval([1.0, 2.0, 3.0])  # sd 1, n 3, t(0.975, 2) = 4.30265
    assert mean == 2.0 and high - mean == pytest.approx(4.302653 / math.sqrt(3)) and mean - low == pytest.approx(high - mean)
    assert mean_interval([0.5]) == (0.5, 0.5, 0.5)  # one seed: no interval
    assert mean_interval([0.7] * 4) == pytest.approx((0.7, 0.7, 0.7))


def test_t95_is_student_s_at_every_df():
    """Published two-sided 95% quantiles, past 30 degrees of freedom too (not the normal's 1.96)."""
    table = {1: 12.7062, 2: 4.3027, 10: 2.2281, 30: 2.0423, 40: 2.0211, 60: 2.0003, 120: 1.9799}
    assert {df: round(t95(df), 4) for df in table} == table
    assert 1.959964 < t95(100_000) < 1.96  # above the normal quantile, tending to it
    with pytest.raises(BebopError, match="at least 2 values"):
        t95(0)


def test_coverage_on_a_known_distribution():
    import random

    rng, covered = random.Random(0), 0
    for _ in range(2000):
        lo, hi = mean_interval([rng.gauss(1.0, 0.3) for _ in range(4)])[1:]
        covered += lo <= 1.0 <= hi
    assert 0.93 <= covered / 2000 <= 0.97  # 95% by construction


def test_no_values():
    with pytest.raises(BebopError, match="no values"):
        mean_interval([])
