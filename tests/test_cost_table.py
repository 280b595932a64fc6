"""`--k auto`'s cost table on compiled steps: kept in the compile store beside the model kind's graphs, read by a
later process instead of profiling again (with the ratios the runs before it measured), profiled again when it
cannot serve the run or cannot be read; a controller that does not refine it makes the same choices in a rerun."""

import copy
import json
import random

import pytest
import torch

from bebop.decoding import DecodeSpec
from bebop.engine import speculative
from bebop.engine import step_costs as costs_module
from bebop.engine.adaptive import AdaptiveK
from bebop.engine.speculative import speculative_generate
from bebop.engine.step_costs import StepCosts, drafter_costs, step_costs
from bebop.errors import BebopError
from bebop.sampling import SamplingParams

from spec_helpers import EOS, PROMPTS, ids_of


@pytest.fixture
def as_compiled(monkeypatch):
    """Steps that count as compiled for the table's sake (the profile runs eager: this is about the file)."""
    monkeypatch.setattr(costs_module, "is_compiled", lambda model: True)


def no_profile(*args, **kwargs):
    raise AssertionError("profiled although a table could serve the run")


def test_the_table_is_kept_and_a_new_process_starts_from_it(spec_model, as_compiled, monkeypatch):
    model = copy.deepcopy(spec_model)  # its own entry in the per-model cache, as a new process has
    costs = step_costs(model, max_rows=len(PROMPTS), max_k=3)
    assert costs.table is not None and json.loads(costs.table.read_text()) == costs.to_dict()
    speculative_generate(model, ids_of(PROMPTS), k="auto", max_k=3, mode="rs", max_new_tokens=16,
                         sampling=SamplingParams(1.0), stop_ids=[EOS], generator=torch.Generator().manual_seed(0))
    measured = json.loads(costs.table.read_text())["log_ratio"]
    assert measured and measured == costs.to_dict()["log_ratio"]  # the call's measured ratios written back

    monkeypatch.setattr(costs_module, "profile", no_profile)
    again = step_costs(copy.deepcopy(spec_model), max_rows=2, max_k=2)  # a smaller run: the table serves it
    assert again is not costs and again.to_dict() == costs.to_dict()
    assert again.predict(3, 2) == costs.predict(3, 2)


def test_a_table_that_cannot_serve_the_run_or_be_read_is_profiled_again(spec_model, as_compiled, monkeypatch):
    profiled = []
    real = costs_module.profile
    monkeypatch.setattr(costs_module, "profile", lambda *a, **kw: profiled.append(kw["max_rows"]) or real(*a, **kw))
    first = step_costs(copy.deepcopy(spec_model), max_rows=2, max_k=2)
    wider = step_costs(copy.deepcopy(spec_model), max_rows=len(PROMPTS), max_k=3)  # more rows and drafts
    assert profiled == [2, len(PROMPTS)] and wider.table == first.table
    negative = [[r, t, -s] for r, t, s in wider.to_dict()["trunk"]]  # covers the run, but no timing can be < 0
    for bad in ("{not json", json.dumps({"max_k": 3}), json.dumps({**wider.to_dict(), "trunk": negative})):
        wider.table.write_text(bad)
        step_costs(copy.deepcopy(spec_model), max_rows=len(PROMPTS), max_k=3)
        assert StepCosts.from_dict(json.loads(wider.table.read_text())).max_k == 3  # profiled and rewritten whole
    assert profiled == [2, len(PROMPTS)] + [len(PROMPTS)] * 3


def test_a_head_run_profiles_its_own_steps_and_a_text_run_the_verify_with_drafts(spec_model, monkeypatch):
    """A run drafting with the head times (and compiles) a plain step and the whole drafting step at every k, not the
    verify with drafts or the head's two verbs, which only a run drafting from the rollouts' text calls; such a run
    profiles again, and its fuller table then serves a head run too."""
    model = copy.deepcopy(spec_model)
    head = drafter_costs(model, "mtp", max_rows=2, max_k=2, mode="rs", sampling=SamplingParams(1.0))
    assert set(head.trunk) == {(1, 1), (2, 1)} and set(head.step) == {(r, k) for r in (1, 2) for k in (1, 2)}
    assert not head.verifies_drafts and StepCosts.from_dict(head.to_dict()).to_dict() == head.to_dict()
    both = drafter_costs(model, "both", max_rows=2, max_k=2, mode="rs", sampling=SamplingParams(1.0))
    assert both is not head and set(both.trunk) == {(r, t) for r in (1, 2) for t in (1, 2, 3)}
    assert both.step and all(s > 0 for s in both.mtp.values())
    monkeypatch.setattr(costs_module, "profile", no_profile)
    assert drafter_costs(model, "mtp", max_rows=2, max_k=2, mode="rs", sampling=SamplingParams(1.0)) is both
    text = drafter_costs(model, "suffix", max_rows=2, max_k=2, mode="rs", sampling=SamplingParams(1.0))
    assert not text.step and set(text.mtp.values()) == {0.0} and text.trunk == both.trunk  # drafts cost no forward
    assert text.predict(2, 2) > text.predict(2, 0)


def test_other_sampling_and_eager_steps_keep_their_own_tables(spec_model, as_compiled, monkeypatch):
    t1 = step_costs(copy.deepcopy(spec_model), max_rows=2, max_k=2, sampling=SamplingParams(1.0)).table
    t2 = step_costs(copy.deepcopy(spec_model), max_rows=2, max_k=2, sampling=SamplingParams(1.0, top_k=5)).table
    monkeypatch.setattr(costs_module, "is_compiled", lambda model: False)
    eager = step_costs(copy.deepcopy(spec_model), max_rows=2, max_k=2)
    assert not eager.compiled and len({t1, t2, eager.table}) == 3 and all(t.exists() for t in (t1, t2, eager.table))


class NoisyClock:
    """perf_counter for the engine's step timings: every reading a random amount later (an unseeded RNG), as a
    shared machine's steps are."""

    def __init__(self) -> None:
        self.now, self.rng = 0.0, random.Random()

    def perf_counter(self) -> float:
        self.now += self.rng.uniform(1e-4, 1e-1)
        return self.now


def test_a_fixed_table_makes_a_rerun_choose_and_sample_the_same(spec_model, monkeypatch):
    """`--k-costs fixed`: the choices come from the table and the acceptance alone, so two processes with the same
    table and seed draw the same tokens at T = 1, however their steps were timed (measured ratios would move them)."""
    monkeypatch.setattr(speculative, "time", NoisyClock())
    runs = []
    for _ in range(2):
        model = copy.deepcopy(spec_model)  # a new process's model: its costs read from the table
        costs = step_costs(model, max_rows=len(PROMPTS), max_k=4)
        if not runs:  # a drafting step priced as a plain one, kept for the rerun: this tiny model's whole drafting
            costs.step = {key: costs.trunk[(key[0], 1)] for key in costs.step}  # step can be dear enough that
            costs.save()  # drafting is never chosen, and both kinds must be here
        controller = AdaptiveK(4, costs, refine=False)
        gens, metrics = speculative_generate(model, ids_of(PROMPTS), k="auto", max_k=4, mode="rs", max_new_tokens=40,
                                             sampling=SamplingParams(1.0), stop_ids=[EOS], controller=controller,
                                             generator=torch.Generator().manual_seed(3))
        runs.append(([g.token_ids for g in gens], metrics.k_histogram))
    assert len({k for by_k in runs[0][1].values() for k in by_k}) > 1  # plain and drafting steps both chosen
    assert runs[0] == runs[1]


def test_k_costs_flag():
    assert DecodeSpec(spec="rs", k="auto", k_costs="fixed").k_costs == "fixed"
    with pytest.raises(BebopError, match="--k-costs fixed needs --k auto"):
        DecodeSpec(spec="rs", k=3, k_costs="fixed")
    with pytest.raises(BebopError, match="unknown --k-costs"):
        DecodeSpec(spec="rs", k="auto", k_costs="frozen")


def test_a_drafting_step_is_priced_by_its_profiled_whole_step():
    """With a head the profile times the whole drafting step at every k, and a drafting step is predicted from it
    (between profiled row counts, linearly), not from verify + k head forwards; a plain step from the verify alone;
    a kept table carries it, and one whose whole steps miss a k is refused (profiled again)."""
    trunk = {(r, t): 0.001 * r * t for r in (1, 4) for t in (1, 2, 3)}
    step = {(1, 1): 0.010, (1, 2): 0.020, (4, 1): 0.040, (4, 2): 0.080}
    costs = StepCosts(trunk, {1: 0.5, 4: 0.5}, max_k=2, step=step)
    assert costs.profiled(1, 2) == pytest.approx(0.020) and costs.profiled(2, 1) == pytest.approx(0.020)
    assert costs.profiled(4, 0) == pytest.approx(0.004)  # plain: the verify of one token
    assert StepCosts(trunk, {1: 0.5, 4: 0.5}, max_k=2).profiled(1, 2) == pytest.approx(0.003 + 2 * 0.5)
    again = StepCosts.from_dict(json.loads(json.dumps(costs.to_dict())))
    assert again.step == step and again.profiled(4, 2) == pytest.approx(0.080)
    short = {**costs.to_dict(), "step": [[r, k, s] for (r, k), s in step.items() if k == 1]}
    with pytest.raises(ValueError):
        StepCosts.from_dict(short)
