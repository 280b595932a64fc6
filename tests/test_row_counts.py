"""Counts that mean what they say (issue 23): a row that finished adds nothing to any count, though it
rides along in the batch until 1/8 of it has finished. With 16 rows and frequent stop tokens, every
generating row takes exactly one forward per step, so step s has #{rows with forwards > s} rows
generating: what k_histogram and the --k auto controller must see, and tokens / forwards is each
row's acceptance length (1 for plain decoding)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from bebop.engine import generate
from bebop.engine.metrics import size_label
from bebop.engine.speculative import speculative_generate
from bebop.sampling import SamplingParams

ROWS = 16
STOPS = list(range(3, 40, 3))  # a tenth of a tiny random model's vocabulary: most rows stop early


def prompts():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, 90, (int(n),), generator=g).tolist() for n in torch.randint(2, 9, (ROWS,), generator=g)]


def generating_per_step(gens) -> list[int]:
    steps = max(g.forwards for g in gens)
    return [sum(g.forwards > s for g in gens) for s in range(steps)]


class SpyController:
    """--k auto's controller interface, always k=2, recording the row counts it is given."""

    suspended = False

    def __init__(self):
        self.chosen, self.observed = [], []

    def choose(self, rows: int) -> int:
        self.chosen.append(rows)
        return 2

    def observe(self, rows: int, k: int, seconds: float, accepted) -> None:
        self.observed.append(rows)


@pytest.mark.parametrize("mode", ["rs", "to"])
def test_finished_rows_riding_along_add_no_forward_and_no_live_row(spec_model, mode):
    gens, metrics = speculative_generate(spec_model, prompts(), k=2, mode=mode, max_new_tokens=30,
                                         sampling=SamplingParams(1.0), stop_ids=STOPS,
                                         generator=torch.Generator().manual_seed(1))
    assert sum(g.finish_reason == "stop" for g in gens) >= ROWS // 2  # rows finish at different steps
    assert len({g.forwards for g in gens}) > 3
    for g in gens:
        assert 1 <= g.forwards <= len(g.token_ids) <= 3 * g.forwards  # acceptance length in [1, K + 1]
    assert sum(g.forwards for g in gens) == metrics.num_drafts + ROWS  # the prefill forward + one per draft
    live = generating_per_step(gens)
    assert metrics.k_histogram == {label: Counter({2: n}) if label != "16-31" else Counter({2: n - 1, 0: 1})
                                   for label, n in Counter(size_label(r) for r in live).items()}


def test_the_k_auto_controller_sees_the_rows_still_generating(spec_model):
    spy = SpyController()
    gens, _ = speculative_generate(spec_model, prompts(), k="auto", mode="rs", max_new_tokens=30,
                                   sampling=SamplingParams(1.0), stop_ids=STOPS,
                                   generator=torch.Generator().manual_seed(1), controller=spy)
    live = generating_per_step(gens)
    assert spy.chosen == live[1:]  # step 0 is the prompt's forward: nothing to draft from yet
    assert set(spy.observed) <= set(live)


def test_plain_decoding_counts_one_forward_per_token(spec_model):
    gens = generate(spec_model, prompts(), max_new_tokens=30, sampling=SamplingParams(1.0), stop_ids=STOPS,
                    generator=torch.Generator().manual_seed(1))
    assert sum(g.finish_reason == "stop" for g in gens) >= ROWS // 2
    assert all(g.forwards == len(g.token_ids) for g in gens)
