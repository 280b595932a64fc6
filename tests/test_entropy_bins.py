"""The entropy law per token: the engine logs every verified draft's (depth, target entropy,
accepted) consistently with its counters; bins and the slope recover a known law with intervals."""

import numpy as np
import pytest
import torch

from bebop.engine.metrics import merged
from bebop.engine.speculative import speculative_generate
from bebop.errors import BebopError
from bebop.sampling import SamplingParams
from bebop.study.entropy_bins import acceptance_slope, entropy_bins, per_token_law, wilson

from spec_helpers import PROMPTS, ids_of


def _known_law(n=6000, slope=-0.3, seed=0):
    """Drafts at depth 1 with P(accept | H) = 0.9 + slope * H, H ~ U(0, 2)."""
    rng = np.random.default_rng(seed)
    h = rng.uniform(0, 2, n)
    accepted = rng.uniform(size=n) < 0.9 + slope * h
    return [(1, float(x), bool(a)) for x, a in zip(h, accepted)]


def test_slope_interval_covers_the_true_law_and_excludes_a_flat_one():
    fit = acceptance_slope(_known_law())
    assert fit["low"] < -0.3 < fit["high"] and fit["high"] < 0 and fit["n"] == 6000
    assert fit["intercept"] == pytest.approx(0.9, abs=0.05)
    flat = acceptance_slope(_known_law(slope=0.0, seed=1))
    assert flat["low"] < 0 < flat["high"]
    assert acceptance_slope(_known_law(), seed=3) == acceptance_slope(_known_law(), seed=3)  # seeded


def test_quantile_bins_hold_equal_counts_and_intervals_cover_the_rates():
    rows = entropy_bins(_known_law(), depths=2, bins=5)
    assert [r["n"] for r in rows] == [1200] * 5
    covered = 0
    for r in rows:
        first, second = r["per_depth"]
        covered += first["low"] <= 0.9 - 0.3 * r["mean_entropy"] <= first["high"]  # 95% each
        assert r["lo"] <= r["mean_entropy"] <= r["hi"]
        assert second == {"depth": 2, "reached": 0, "accepted": 0, "rate": None, "low": 0.0, "high": 1.0}
    assert covered >= 4


def test_wilson_edges():
    assert wilson(0, 0) == (0.0, 1.0)
    low, high = wilson(50, 50)
    assert high == pytest.approx(1.0) and 0.9 < low < 1.0
    low, high = wilson(5, 10)
    assert low < 0.5 < high and high - 0.5 == pytest.approx(0.5 - low)


def test_bad_input():
    with pytest.raises(BebopError, match="no verified drafts"):
        entropy_bins([], depths=1)
    with pytest.raises(BebopError, match="bins must be >= 1"):
        entropy_bins(_known_law(), depths=1, bins=0)
    with pytest.raises(BebopError, match="different entropies"):
        acceptance_slope([(1, 0.5, True)] * 10)
    assert per_token_law([(1, 0.5, True)] * 10, 1, 4)["first_draft_slope"] is None  # no slope, no crash


@pytest.mark.parametrize("mode", ["rs", "to"])
def test_the_engine_logs_every_verified_draft(spec_model, mode):
    sampling = SamplingParams(1.0)
    runs = []
    for seed in (0, 1):
        _, metrics = speculative_generate(spec_model, ids_of(PROMPTS), k=3, mode=mode, max_new_tokens=24,
                                          sampling=sampling, generator=torch.Generator().manual_seed(seed),
                                          log_drafts=True)
        log = metrics.draft_log
        assert sum(d == 1 for d, _, _ in log) == metrics.num_drafts  # every chain reaches depth 1
        assert sum(a for _, _, a in log) == metrics.num_accepted_tokens
        for d in (1, 2, 3):  # depth d accepted -> d + 1 reached (when d < K)
            accepted_here = sum(1 for dd, _, a in log if dd == d and a)
            assert accepted_here == metrics.accepted_per_position[d - 1]
            if d < 3:
                assert sum(1 for dd, _, _ in log if dd == d + 1) == accepted_here
        assert all(h >= 0 for _, h, _ in log)
        runs.append(metrics)
    both = merged(runs, 3)
    assert both.draft_log == runs[0].draft_log + runs[1].draft_log
    _, plain = speculative_generate(spec_model, ids_of(PROMPTS), k=3, mode=mode, max_new_tokens=8, sampling=sampling,
                                    generator=torch.Generator().manual_seed(0))
    assert plain.draft_log is None and merged([plain], 3).draft_log is None
