"""95% t-intervals of a mean over a few seeds."""

import math

import pytest

from bebop.errors import BebopError
from bebop.study.intervals import mean_interval, t_quantile


def test_known_values():
    mean, low, high = mean_interval([1.0, 2.0, 3.0])  # sd 1, n 3, t(0.975, 2) = 4.303
    assert mean == 2.0 and high - mean == pytest.approx(4.303 / math.sqrt(3)) and mean - low == pytest.approx(high - mean)
    assert mean_interval([0.5]) == (0.5, 0.5, 0.5)  # one seed: no interval
    assert mean_interval([0.7] * 4) == pytest.approx((0.7, 0.7, 0.7))
    assert t_quantile(1) == 12.706 and t_quantile(30) == 2.042 and t_quantile(100) == pytest.approx(1.96, abs=1e-3)


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
