"""The entropy-acceptance law: a least-squares line y = intercept + slope * H.

    fit = fit_line(entropies, accept_lengths)   # -> LinearFit(slope, intercept, r2, n)

docs/method.md section 5: mean acceptance length falls linearly as the target's entropy H rises. The
paper's slopes (accept length per nat): about -1.68 for target-only drafting and for rejection
sampling with a CE-trained head, about -0.06 for rejection sampling with a TV-trained head.
Written as alpha = a - b*H in the paper; here `slope` is -b and `intercept` is a.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from bebop.errors import BebopError
from bebop.stats.intervals import t95

PAPER_SLOPES = {"to": -1.68, "rs+ce": -1.68, "rs+tv": -0.06}


@dataclass(frozen=True)
class LinearFit:
    slope: float
    intercept: float
    r2: float  # coefficient of determination; 1.0 when every y is the same (a flat line fits exactly)
    n: int

    def predict(self, x: float) -> float:
        return self.intercept + self.slope * x

    def to_dict(self) -> dict:
        return asdict(self)


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> LinearFit:
    """Ordinary least squares of ys on xs (at least two distinct xs)."""
    if len(xs) != len(ys):
        raise BebopError(f"fit_line: {len(xs)} x values but {len(ys)} y values")
    n = len(xs)
    if n < 2:
        raise BebopError(f"fit_line needs at least 2 points, got {n}")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise BebopError("fit_line needs at least 2 distinct x values (all entropies are equal)")
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    slope = sxy / sxx
    intercept = my - slope * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - (intercept + slope * x)) ** 2 for x, y in zip(xs, ys))
    r2 = 1.0 if ss_tot == 0 else 1.0 - ss_res / ss_tot
    return LinearFit(slope, intercept, r2, n)


def slope_interval(xs: Sequence[float], ys: Sequence[float]) -> tuple[LinearFit, float, float]:
    """(fit, low, high): the least-squares line and the 95% t-interval of its slope (n - 2 degrees
    of freedom, residuals taken as independent; needs at least 3 points)."""
    fit = fit_line(xs, ys)
    if fit.n < 3:
        raise BebopError(f"a slope interval needs at least 3 points, got {fit.n}")
    mx = sum(xs) / fit.n
    sxx = sum((x - mx) ** 2 for x in xs)
    ss_res = sum((y - fit.predict(x)) ** 2 for x, y in zip(xs, ys))
    half = t95(fit.n - 2) * math.sqrt(ss_res / (fit.n - 2) / sxx)
    return fit, fit.slope - half, fit.slope + half
