"""The entropy law per token: the engine logs every verified draft's (depth, target entropy,
accepted, sequence) consistently with its counters; bins and the slope recover a known law with
intervals, which take whole sequences as the independent units when the log names them."""

import numpy as np
import pytest
import torch

from bebop.engine.metrics import merged
from bebop.engine.speculative import speculative_generate
from bebop.errors import BebopError
from bebop.sampling import SamplingParams
from bebop.stats.entropy_bins import acceptance_slope, entropy_bins, per_token_law, wilson
from bebop.stats.intervals import mean_interval

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
    with pytest.raises(BebopError, match=r"\(depth, entropy, accepted\[, sequence\]\)"):
        entropy_bins([(1, 0.5, True), (1, 0.7, False, 3)], depths=1)


def _sequences_alike_inside(sequences=40, length=25, seed=0):
    """Sequences whose every draft shares the sequence's entropy and acceptance (perfectly correlated
    inside a sequence): the log holds `length` copies of each sequence's one draw, at depth 1."""
    rng = np.random.default_rng(seed)
    h = rng.uniform(0, 2, sequences)  # (S,)
    accepted = (rng.uniform(size=sequences) < 0.9 - 0.3 * h).astype(float)  # (S,)
    log = [(1, float(h[s]), float(accepted[s]), s) for s in range(sequences) for _ in range(length)]
    return log, h, accepted


def test_the_slope_interval_resamples_whole_sequences():
    """With sequence ids the bootstrap draws sequences: the interval is the one over the sequences' own
    points (the same draws give the same slopes), about sqrt(25) = 5 times the drafts' bootstrap, which
    counts every copy as new evidence."""
    log, h, accepted = _sequences_alike_inside()
    clustered = acceptance_slope(log)
    by_draft = acceptance_slope([record[:3] for record in log])
    per_sequence = acceptance_slope([(1, float(x), float(a)) for x, a in zip(h, accepted)])
    width = lambda fit: fit["high"] - fit["low"]  # noqa: E731
    assert clustered["slope"] == pytest.approx(by_draft["slope"]) and clustered["clusters"] == 40
    assert width(clustered) == pytest.approx(width(per_sequence), rel=1e-9)
    assert width(clustered) > 3 * width(by_draft)


def test_the_bin_intervals_count_sequences_not_copies():
    """A bin's rate interval with sequence ids is about the t-interval over the sequences' rates (each
    sequence one draw), not the Wilson interval of 1000 independent drafts."""
    log, _, accepted = _sequences_alike_inside()
    (clustered,) = entropy_bins(log, depths=1, bins=1)
    (by_draft,) = entropy_bins([record[:3] for record in log], depths=1, bins=1)
    _, low, high = mean_interval(list(accepted))
    got = clustered["per_depth"][0]
    assert got["rate"] == pytest.approx(accepted.mean()) and got["reached"] == 1000
    assert got["high"] - got["low"] == pytest.approx(high - low, rel=0.2)
    assert got["high"] - got["low"] > 3 * (by_draft["per_depth"][0]["high"] - by_draft["per_depth"][0]["low"])


def test_independent_sequences_keep_the_drafts_interval():
    """Sequence ids on drafts that are independent inside their sequences change the intervals little."""
    law = _known_law()
    with_ids = [(d, h, a, i // 20) for i, (d, h, a) in enumerate(law)]  # 300 sequences of 20 drafts
    plain, clustered = acceptance_slope(law), acceptance_slope(with_ids)
    assert clustered["high"] - clustered["low"] == pytest.approx(plain["high"] - plain["low"], rel=0.25)
    (row,) = entropy_bins(with_ids, depths=1, bins=1)
    (ref,) = entropy_bins(law, depths=1, bins=1)
    ours, theirs = row["per_depth"][0], ref["per_depth"][0]
    assert ours["high"] - ours["low"] == pytest.approx(theirs["high"] - theirs["low"], rel=0.2)


@pytest.mark.parametrize("mode", ["rs", "to"])
def test_the_engine_logs_every_verified_draft(spec_model, mode):
    sampling = SamplingParams(1.0)
    runs = []
    for seed in (0, 1):
        _, metrics = speculative_generate(spec_model, ids_of(PROMPTS), k=3, mode=mode, max_new_tokens=24,
                                          sampling=sampling, generator=torch.Generator().manual_seed(seed),
                                          log_drafts=True)
        log = metrics.draft_log
        assert sum(d == 1 for d, _, _, _ in log) == metrics.num_drafts  # every chain reaches depth 1
        assert sum(a for _, _, a, _ in log) == metrics.num_accepted_tokens
        for d in (1, 2, 3):  # depth d accepted -> d + 1 reached (when d < K)
            accepted_here = sum(1 for dd, _, a, _ in log if dd == d and a)
            assert accepted_here == metrics.accepted_per_position[d - 1]
            if d < 3:
                assert sum(1 for dd, _, _, _ in log if dd == d + 1) == accepted_here
        assert all(h >= 0 for _, h, _, _ in log)
        assert {s for *_, s in log} == set(range(len(PROMPTS)))  # each draft names its prompt's row
        runs.append(metrics)
    both = merged(runs, 3)
    moved = [(d, h, a, s + len(PROMPTS)) for d, h, a, s in runs[1].draft_log]  # the second call's rows apart
    assert both.draft_log == runs[0].draft_log + moved
    _, plain = speculative_generate(spec_model, ids_of(PROMPTS), k=3, mode=mode, max_new_tokens=8, sampling=sampling,
                                    generator=torch.Generator().manual_seed(0))
    assert plain.draft_log is None and merged([plain], 3).draft_log is None
