"""`--k auto`'s cost table on compiled steps: kept in the compile store beside the model kind's graphs, read by a
later process instead of profiling again (with the ratios the runs before it measured), profiled again when it
cannot serve the run or cannot be read, and never written for eager steps."""

import copy
import json

import pytest
import torch

from bebop.engine import step_costs as costs_module
from bebop.engine.speculative import speculative_generate
from bebop.engine.step_costs import StepCosts, step_costs
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


def test_other_sampling_keeps_its_own_table_and_eager_steps_keep_none(spec_model, as_compiled, monkeypatch):
    t1 = step_costs(copy.deepcopy(spec_model), max_rows=2, max_k=2, sampling=SamplingParams(1.0)).table
    t2 = step_costs(copy.deepcopy(spec_model), max_rows=2, max_k=2, sampling=SamplingParams(1.0, top_k=5)).table
    assert t1 != t2 and t1.exists() and t2.exists()
    monkeypatch.setattr(costs_module, "is_compiled", lambda model: False)
    eager = step_costs(copy.deepcopy(spec_model), max_rows=2, max_k=2)
    eager.save()
    assert eager.table is None and sorted(t1.parent.iterdir()) == sorted([t1, t2])
