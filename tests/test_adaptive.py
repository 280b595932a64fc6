"""Adaptive speculation: the acceptance estimate, the cost model and the choice of k."""

import math

import pytest

from bebop.engine import generate
from bebop.engine import speculative as spec
from bebop.engine.adaptive import (
    FAR_PROBE_EVERY,
    PRIOR_ACCEPTANCE,
    PROBE_BAND,
    PROBE_EVERY,
    PROBE_K,
    AcceptanceEstimate,
    AdaptiveK,
)
from bebop.engine.metrics import rows_bucket
from bebop.engine.step_costs import MAX_JUMP, StepCosts, profile, step_costs
from bebop.errors import BebopError
from bebop.sampling import SamplingParams

from spec_helpers import PROMPTS, ids_of


def _costs(per_token: float, fixed: float, mtp: float = 0.0, max_k: int = 6) -> StepCosts:
    """A synthetic profile: a trunk forward costs fixed + per_token * rows * t."""
    trunk = {(r, t): fixed + per_token * r * t for r in (1, 4, 16, 64) for t in (1, max_k + 1)}
    return StepCosts(trunk, {r: mtp for r in (1, 4, 16, 64)}, max_k)


def test_acceptance_estimate_recovers_per_depth_rates():
    est = AcceptanceEstimate(4)
    # each row: depth 1 accepted with 0.9, then depth 2 with 0.5, depths 3-4 never
    for _ in range(30):
        est.observe(4, [0] * 10 + [1] * 45 + [2] * 45)
    rates = est.rates()
    assert rates[0] == pytest.approx(0.9, abs=0.01) and rates[1] == pytest.approx(0.5, abs=0.01)
    assert rates[2] < 0.05
    assert est.expected_tokens(2) == pytest.approx(1 + rates[0] + rates[0] * rates[1])
    assert est.expected_tokens(0) == 1.0


def test_unseen_depth_borrows_the_depth_before():
    est = AcceptanceEstimate(3)
    for _ in range(30):
        est.observe(1, [1] * 95 + [0] * 5)  # only depth 1 was ever verified
    assert est.rates()[1] == pytest.approx(est.rates()[0]) == pytest.approx(0.95, abs=0.01)


def _measured(policy: AdaptiveK, rows: int) -> AdaptiveK:
    """Record a plain and a drafting step at `rows`, exactly as profiled."""
    policy.observe(rows, 0, policy.costs.profiled(rows, 0), [])
    policy.observe(rows, 1, policy.costs.profiled(rows, 1), [])
    return policy


def test_plain_and_drafting_steps_are_measured_first():
    policy = AdaptiveK(4, _costs(per_token=0.0, fixed=1.0, mtp=0.01, max_k=4))
    assert policy.choose(8) == 0
    policy.observe(8, 0, 1.0, [])
    k = policy.choose(8)
    assert k > 0
    policy.observe(8, k, 1.0, [])
    assert policy.choose(33) == 4  # a new bucket starts from its neighbour's measurements: no probe


def test_memory_bound_steps_draft_deep_and_compute_bound_steps_go_plain():
    high = AcceptanceEstimate(6)
    for _ in range(20):
        high.observe(6, [6] * 8 + [3] * 2)
    flat = AdaptiveK(6, _costs(per_token=0.0, fixed=1.0, mtp=0.02))  # verifying k+1 costs what 1 costs
    flat.acceptance = high
    assert _measured(flat, 1).choose(rows=1) == 6
    linear = AdaptiveK(6, _costs(per_token=1.0, fixed=0.0, mtp=0.3))  # k+1 tokens cost k+1 times as much
    linear.acceptance = high
    assert _measured(linear, 64).choose(rows=64) == 0


def test_measured_steps_correct_the_profile():
    policy = AdaptiveK(3, _costs(per_token=0.0, fixed=1.0, mtp=0.0, max_k=3))
    for _ in range(20):
        policy.acceptance.observe(3, [3] * 10)
    assert _measured(policy, 8).choose(8) == 3
    for _ in range(20):  # drafting turns out to cost 10x the profile at this size
        policy.observe(8, 3, seconds=10.0, accepted=[])
    assert policy.choose(8) == 0
    assert _measured(policy, 1).choose(1) == 3  # another live-batch size keeps its own ratios


def _at_prior(k: int, rows: int = 1000) -> list[int]:
    """Accepted-draft counts of `rows` drafting rows, accepted at each depth with the prior's rate."""
    a = PRIOR_ACCEPTANCE
    shares = [a ** n * (1 - a) for n in range(k)] + [a ** k]  # P(n accepted), n = 0..k
    return [n for n, share in enumerate(shares) for _ in range(round(share * rows))]


def _run_steps(policy: AdaptiveK, rows: int, steps: int) -> list[int]:
    """The k chosen at each of `steps` decode steps over `rows` rows, each measured as profiled (a drafting step's
    acceptance at the prior's rate)."""
    choices = []
    for _ in range(steps):
        k = policy.choose(rows)
        choices.append(k)
        policy.observe(rows, k, policy.costs.profiled(rows, k), _at_prior(k) if k else [])
    return choices


def test_the_kind_not_chosen_is_probed_again():
    # drafting predicted just short of the margin (edge 0.99): within the band, so it is measured again
    policy = AdaptiveK(4, _costs(per_token=0.6 / 64, fixed=1.0, mtp=0.2, max_k=4))
    assert PROBE_BAND < policy.drafting_edge(64, policy.best_draft(64)) < 1
    choices = _run_steps(policy, 64, PROBE_EVERY + 3)
    assert choices[0] == PROBE_K  # the kind not chosen measured first, with the cheapest drafting step
    assert choices[1:].count(0) == len(choices) - 2 and PROBE_K in choices[1:]  # plain, drafting measured again


def test_a_new_controller_over_cached_costs_measures_the_acceptance_first():
    """Costs are cached per model and outlive a call; the acceptance estimate is each controller's own. A new
    call's controller over costs that already measured drafting has verified no draft: its acceptance is the
    prior, which may undersell the head, so it measures drafting before settling on plain steps."""
    costs = _costs(per_token=0.6 / 64, fixed=1.0, mtp=0.2, max_k=4)
    _run_steps(AdaptiveK(4, costs), 64, 3)  # an earlier call measured both kinds
    fresh = AdaptiveK(4, costs)
    assert fresh.best(64) == 0 and fresh.choose(64) == PROBE_K
    fresh.observe(64, PROBE_K, costs.profiled(64, PROBE_K), _at_prior(PROBE_K))
    assert fresh.choose(64) == 0  # measured: the usual schedule from here


def test_drafting_that_cannot_win_is_probed_rarely():
    """A compute-bound live batch (a verify over k + 1 tokens costs k + 1 plain steps): every step plain, the
    first drafting measurement included, so `--k auto` costs what plain decoding does; a long run still
    measures drafting, rarely."""
    policy = AdaptiveK(4, _costs(per_token=1.0, fixed=0.0, mtp=0.5, max_k=4))
    assert policy.drafting_edge(64, policy.best_draft(64)) < PROBE_BAND
    choices = _run_steps(policy, 64, FAR_PROBE_EVERY + 3)
    assert choices[:FAR_PROBE_EVERY] == [0] * FAR_PROBE_EVERY
    assert sum(k > 0 for k in choices[FAR_PROBE_EVERY:]) == 1


def test_a_level_read_from_a_table_does_not_stop_a_new_process_probing():
    """A table keeps the ratios an earlier process measured (a slow moment of a shared machine): a new process
    measures drafting itself before it trusts a level that puts drafting far below plain steps, and its own
    measurement replaces the table's."""
    costs = _costs(per_token=0.0, fixed=1.0, mtp=0.01, max_k=4)  # memory-bound: drafting is the better kind
    costs.log_ratio[(rows_bucket(8), True)] = 3.0  # read from a table: drafting 20x its profile
    policy = AdaptiveK(4, costs)
    assert policy.drafting_edge(8, policy.best_draft(8)) < PROBE_BAND and policy.best(8) == 0
    assert policy.choose(8) == PROBE_K  # probed, not far
    policy.observe(8, PROBE_K, costs.profiled(8, PROBE_K), _at_prior(PROBE_K))  # as profiled, here
    assert costs.level(rows_bucket(8), True) == 0.0 and policy.best(8) > 0


@pytest.mark.parametrize("refine", [True, False])
def test_a_controller_that_does_not_refine_settles_as_one_that_does(refine):
    """Without refining (`--k-costs fixed`) the steps still count as measured: each kind is measured once, then the
    better one runs (no probe of the other before PROBE_EVERY steps)."""
    policy = AdaptiveK(4, _costs(per_token=0.0, fixed=1.0, mtp=0.01, max_k=4), refine=refine)
    choices = _run_steps(policy, 8, 20)
    assert choices[0] == 0 and choices[2:] == [4] * 18, choices


def _steps(policy: AdaptiveK, rows: int, steps: int, drafting_ratio: float) -> list[int]:
    """_run_steps with every drafting step measured at `drafting_ratio` x its profile."""
    choices = []
    for _ in range(steps):
        k = policy.choose(rows)
        choices.append(k)
        ratio = drafting_ratio if k else 1.0
        policy.observe(rows, k, ratio * policy.costs.profiled(rows, k), _at_prior(k) if k else [])
    return choices


@pytest.mark.parametrize("again", [20.0, 1.0])
def test_one_slow_drafting_step_does_not_stop_probes_two_do(again):
    """Drafting is spaced out to every FAR_PROBE_EVERY steps only when the best of two of its own measurements
    says it is far from winning: one slow step (a shared machine) is probed again at the usual PROBE_EVERY."""
    costs = _costs(per_token=0.0, fixed=1.0, mtp=0.01, max_k=4)
    policy = AdaptiveK(4, costs)
    policy.observe(8, 0, costs.profiled(8, 0), [])
    policy.observe(8, PROBE_K, 20 * costs.profiled(8, PROBE_K), _at_prior(PROBE_K))  # one slow drafting step
    assert policy.drafting_edge(8, policy.best_draft(8)) < PROBE_BAND
    first = _steps(policy, 8, PROBE_EVERY + 2, again)
    assert first.count(PROBE_K) == 1 and first[-2] == PROBE_K  # probed again, not far
    later = _steps(policy, 8, 2 * PROBE_EVERY + 2, again)
    # two slow: far, no probe in 2 x PROBE_EVERY steps; one slow and one as profiled: probed every PROBE_EVERY
    assert sum(k > 0 for k in later) == (0 if again > 1 else 2)


def test_a_level_borrowed_from_another_size_does_not_stop_probes():
    """Drafting measured as hopeless at 64 rows says nothing final about 2 rows (memory-bound there): that
    bucket still measures drafting on the usual schedule, and keeps drafting once its own steps show it wins."""
    policy = AdaptiveK(4, _costs(per_token=1 / 16, fixed=1.0, mtp=0.01, max_k=4))
    policy.observe(64, 0, policy.costs.profiled(64, 0), [])
    policy.observe(64, 3, 5 * policy.costs.profiled(64, 3), [])  # drafting at 64 rows: 5x its profile
    assert policy.drafting_edge(2, policy.best_draft(2)) < PROBE_BAND  # the borrowed level says: far
    choices = _run_steps(policy, 2, PROBE_EVERY + 3)
    assert any(k > 0 for k in choices)  # measured at its own size, where it is as cheap as profiled
    assert _run_steps(policy, 2, 5) == [policy.best_draft(2)] * 5


def test_one_slow_step_moves_the_estimate_a_bounded_amount():
    costs = _costs(per_token=0.0, fixed=1.0, mtp=0.0, max_k=4)
    costs.observe(16, 2, seconds=costs.profiled(16, 2))
    costs.observe(16, 2, seconds=100 * costs.profiled(16, 2))  # the machine stalled for one step
    assert costs.predict(16, 2) / costs.profiled(16, 2) == pytest.approx(math.exp(0.2 * MAX_JUMP))


def test_an_unmeasured_k_borrows_the_ratio_of_its_own_kind():
    """Drafting steps carry work that plain steps do not (acceptance, drafting loop): a slow drafting
    step must not make plain steps look slow, nor a fast plain step make drafting look cheap."""
    costs = _costs(per_token=0.0, fixed=1.0, mtp=0.0, max_k=4)
    costs.observe(16, 0, seconds=1.0)
    costs.observe(16, 2, seconds=3.0)
    assert costs.predict(16, 0) == pytest.approx(1.0)
    assert costs.predict(16, 4) == pytest.approx(3.0) and costs.predict(16, 1) == pytest.approx(3.0)


def test_every_decode_step_but_the_first_is_measured_and_the_prefill_is_not(spec_model):
    class Recorder(AdaptiveK):
        def observe(self, rows, k, seconds, accepted):
            self.calls = getattr(self, "calls", 0) + 1
            super().observe(rows, k, seconds, accepted)

    policy = Recorder(2, _costs(per_token=0.0, fixed=1.0, mtp=0.0, max_k=2))
    gens, _ = spec.speculative_generate(spec_model, ids_of(["hello"]), k="auto", max_k=2, mode="rs",
                                        max_new_tokens=5, controller=policy)
    steps = sum(sum(c.values()) for c in _.k_histogram.values())
    # the prompt is prefilled before the first step (engine/prefill.py); every step is a decode step, the first
    # drafting one too (its refresh covers the one position decoded since); the run's first step carries one-time
    # work and is not
    assert steps == 5 and policy.calls == steps - 1


def test_profile_times_every_shape(spec_model):
    costs = profile(spec_model, max_rows=5, max_k=3)
    assert set(costs.trunk) == {(r, t) for r in (1, 4, 5) for t in (1, 2, 3, 4)}  # the verify at every k
    assert all(s > 0 for s in costs.trunk.values()) and all(s > 0 for s in costs.mtp.values())
    assert costs.predict(3, 2) > 0
    assert step_costs(spec_model, max_rows=5, max_k=3) is step_costs(spec_model, max_rows=4, max_k=2)


def test_profile_times_steps_not_cache_allocations(spec_model, monkeypatch):
    """A cache allocated inside a timing (zeroing rows x layers x capacity) weighed on every verify alike and
    flattened the profile's shape in k: the caches are made once per row count, outside the timed calls."""
    made = []
    for owner in (type(spec_model), type(spec_model.require_mtp())):
        original = owner.new_cache
        monkeypatch.setattr(owner, "new_cache", lambda self, *a, _f=original, **kw: made.append(a[0]) or _f(self, *a, **kw))
    profile(spec_model, max_rows=5, max_k=3)
    assert sorted(made) == [1, 1, 1, 4, 4, 4, 5, 5, 5]  # per row count: the trunk's, the head's, the refresh's


@pytest.mark.parametrize("mode", ["rs", "to"])
def test_auto_equals_greedy_at_temperature_zero(spec_model, mode):
    prompts = ids_of(PROMPTS)
    ref = generate(spec_model, prompts, max_new_tokens=25, sampling=SamplingParams(0.0))
    gens, metrics = spec.speculative_generate(spec_model, prompts, k="auto", max_k=4, mode=mode, max_new_tokens=25,
                                              sampling=SamplingParams(0.0))
    assert [g.token_ids for g in gens] == [r.token_ids for r in ref]
    assert metrics.k == 4 and sum(sum(c.values()) for c in metrics.k_histogram.values()) > 0


@pytest.mark.parametrize("k,max_k,needle", [("auto", 0, "--max-k"), ("auto", 9, "--max-k"), ("deep", 6, "auto"),
                                            (0, 6, "K")])
def test_bad_adaptive_settings(spec_model, k, max_k, needle):
    with pytest.raises(BebopError, match=needle):
        spec.speculative_generate(spec_model, ids_of(["a"]), k=k, max_k=max_k, mode="rs", max_new_tokens=3)
