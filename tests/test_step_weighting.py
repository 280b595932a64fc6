"""The step weighting of `mtp diagnose` and of the study's exact measure against the engine, on a model built by
hand (tests/markov_toy.py) whose head is sure after one token and unsure after the other: the starts must be
weighted by the law of the tokens that actually follow (docs/method.md section 8), and the closed form, the
engine and the diagnosis agree within 1%.

False failure: 64 rows x 512 tokens give about 10,000 steps at K = 3; the engine's and the diagnosis's standard
errors are about 0.25% of the mean acceptance length, so 1% is 4 standard errors (two-sided, about 1e-4 per
comparison); the seeds are fixed.
"""

from types import SimpleNamespace

import pytest
import torch

from bebop.engine.speculative import speculative_generate
from bebop.mtp.diagnose import diagnose
from bebop.mtp.rollout_files import RolloutIds
from bebop.policy import Policy
from bebop.sampling import SamplingParams
from markov_toy import markov_mean_length, markov_model, renewal_mean_length, tables

ROWS, TOKENS = 64, 512
SAMPLING = SamplingParams(1.0)
# the two-token toy: target uniform; the head a point mass on A after A, uniform after B
SURE_AFTER_A = ([[0.5, 0.5], [0.5, 0.5]], [[1.0, 0.0], [0.5, 0.5]])
# a target that depends on the previous token too, so that TO's acceptance does as well
STICKY = ([[0.3, 0.7], [0.9, 0.1]], [[0.999, 0.001], [0.95, 0.05]])


def _engine(model, k: int, mode: str, seed: int):
    gens, metrics = speculative_generate(model, [[0]] * ROWS, k=k, mode=mode, max_new_tokens=TOKENS,
                                         sampling=SAMPLING, generator=torch.Generator().manual_seed(seed))
    return [RolloutIds(i, [0], g.token_ids) for i, g in enumerate(gens)], metrics.mean_acceptance_length


@pytest.mark.parametrize("design, runs", [(SURE_AFTER_A, [("rs", 1), ("rs", 3)]),
                                          (STICKY, [("rs", 3), ("to", 3)])], ids=["sure-after-A", "sticky"])
def test_the_diagnosis_weights_starts_as_the_engine_reaches_them(design, runs):
    model = markov_model(*design)
    law = tables(model)
    assert law[0] == pytest.approx(torch.tensor(design[0]).numpy(), abs=1e-5)
    rollouts, _ = _engine(model, 3, "rs", seed=0)  # on-policy: the engine is lossless
    report = diagnose(Policy(model, SimpleNamespace(pad_id=0, eos_id=None)), rollouts, k=3, sampling=SAMPLING, progress=False,
                      batch_size=512)
    for n, (mode, k) in enumerate(runs):
        exact = markov_mean_length(law, k, mode)
        _, measured = _engine(model, k, mode, seed=1 + n)
        predicted = report["mean_acceptance_length"][mode][str(k)]
        assert measured == pytest.approx(exact, rel=0.01), (mode, k, measured, exact)
        assert predicted == pytest.approx(exact, rel=0.01), (mode, k, predicted, exact)
        assert predicted == pytest.approx(measured, rel=0.01), (mode, k, predicted, measured)
        # the weighting by the chain's law alone converges elsewhere: this test can see it
        assert renewal_mean_length(law, k, mode) != pytest.approx(exact, rel=0.025)
