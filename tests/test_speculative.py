"""Speculative generation: T=0 equals plain greedy, ragged acceptance bookkeeping, losslessness
end to end, metrics, observations, bad input."""


import pytest
import torch

from bebop.engine import generate
from bebop.engine import speculative as spec
from bebop.errors import BebopError
from bebop.model import load_model
from bebop.sampling import SamplingParams, warp_probs

from conftest import CHAR_CODEC
from spec_helpers import (
    EOS,
    PROMPTS,
    assert_marginals_follow,
    assert_positions_follow,
    ids_of,
    mixture_drafter,
    on_path,
    oracle_drafter,
)

PATHS = ("float32", "bfloat16", "compiled")


@pytest.fixture(scope="module", params=PATHS)
def dtype_model(request, spec_model):
    """spec_model on each path the engine samples on: float32 eager, a bfloat16 rollout copy, float32 with compiled
    steps (issue 24): lossless against its own target, T=0 equal to greedy of the same dtype."""
    return on_path(spec_model, request.param)


@pytest.mark.parametrize("mode", ["rs", "to"])
@pytest.mark.parametrize("dtype_model,k", [pytest.param(path, k, marks=[pytest.mark.slow] if path == "compiled" and k != 3
                                                        else []) for path in PATHS for k in (1, 3, 8)],
                         indirect=["dtype_model"])
def test_greedy_equals_plain_with_random_head(dtype_model, mode, k):
    """T=0: speculation equals plain greedy of the same path. Compiled, each k is a graph of its own (one to two cold
    minutes a k and mode): the default suite runs k = 3 there, -m slow the others."""
    prompts = ids_of(PROMPTS)
    ref = generate(dtype_model, prompts, max_new_tokens=40, sampling=SamplingParams(0.0), stop_ids=[EOS])
    gens, metrics = spec.speculative_generate(dtype_model, prompts, k=k, mode=mode, max_new_tokens=40,
                                              sampling=SamplingParams(0.0), stop_ids=[EOS])
    for a, b in zip(gens, ref):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert a.logprobs == [0.0] * len(a.token_ids)
    assert metrics.num_drafts > 0


@pytest.mark.parametrize("mode", ["rs", "to"])
def test_ragged_acceptance_keeps_greedy_output(spec_model, monkeypatch, mode):
    """With drafts that are often right, rows accept different numbers of tokens every step and
    caches roll back by different amounts; the output must still be plain greedy, and stop
    tokens / max_new_tokens inside an accepted run must truncate there."""
    prompts = ids_of(PROMPTS)
    ref = generate(spec_model, prompts, max_new_tokens=37, sampling=SamplingParams(0.0), stop_ids=[EOS])
    stop = ref[1].token_ids[20]  # a token that occurs mid-sequence, so stops land inside accepted runs
    ref = generate(spec_model, prompts, max_new_tokens=37, sampling=SamplingParams(0.0), stop_ids=[EOS, stop])
    monkeypatch.setattr(spec, "_draft", oracle_drafter(spec_model, prompts, corrupt=0.5, seed=0))
    gens, metrics = spec.speculative_generate(spec_model, prompts, k=4, mode=mode, max_new_tokens=37,
                                              sampling=SamplingParams(0.0), stop_ids=[EOS, stop])
    for a, b in zip(gens, ref):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
    assert metrics.mean_acceptance_length > 2.5  # many multi-token steps were exercised
    assert 0 < metrics.acceptance_rate_per_position[-1] < 1


@pytest.mark.parametrize("drafter", ["head", "oracle"])
@pytest.mark.parametrize("dtype_model", ["float32", "compiled"], indirect=True)
def test_after_every_step_the_caches_hold_the_hosts_lengths(dtype_model, monkeypatch, drafter):
    """The verify drops a row's rejected drafts and the head's chain its drafts on the device, and the host sets a
    length only where a stop or the budget cut an accepted run short: after every step both caches' lengths are
    the host's. The head drafts as one whole step (its acceptance ragged, low); the oracle, right most of the time,
    makes long runs that stops and budgets cut."""
    prompts = ids_of(PROMPTS)
    ref = generate(dtype_model, prompts, max_new_tokens=37, sampling=SamplingParams(0.0), stop_ids=[EOS])
    stop = ref[1].token_ids[20]  # a token that occurs mid-sequence, so stops land inside accepted runs
    if drafter == "oracle":
        monkeypatch.setattr(spec, "_draft", oracle_drafter(dtype_model, prompts, corrupt=0.5, seed=0))
    held = []
    real_step = spec._SpeculativeRun.step

    def step(run):
        real_step(run)
        if run.live:
            held.append((run.cache.lengths.tolist(), run.mtp_cache.lengths.tolist()) == (run.trunk_len, run.mtp_len))

    monkeypatch.setattr(spec._SpeculativeRun, "step", step)
    _, metrics = spec.speculative_generate(dtype_model, prompts, k=4 if drafter == "oracle" else 3, mode="rs",
                                           max_new_tokens=37, sampling=SamplingParams(0.0), stop_ids=[EOS, stop])
    assert len(held) > 5 and all(held)
    assert 0 < metrics.acceptance_rate_per_position[0] < 1  # drafts were rejected: the device dropped them


def test_observations_prefilled_then_drafting_resumes(spec_model, monkeypatch):
    prompts = ids_of(PROMPTS[:3])
    free = generate(spec_model, prompts, max_new_tokens=12, sampling=SamplingParams(0.0))
    interrupt = free[0].token_ids[3]
    obs = CHAR_CODEC.encode("<obs>42</obs>")
    kwargs = dict(max_new_tokens=30, sampling=SamplingParams(0.0), interrupt_ids=[interrupt],
                  observer=lambda row, toks: obs)
    ref = generate(spec_model, prompts, **kwargs)
    monkeypatch.setattr(spec, "_draft", oracle_drafter(spec_model, prompts, corrupt=0.3, seed=1))
    gens, metrics = spec.speculative_generate(spec_model, prompts, k=3, mode="rs", **kwargs)
    for a, b in zip(gens, ref):
        assert a.token_ids == b.token_ids and a.policy_mask == b.policy_mask
    assert obs[0] in gens[0].token_ids and metrics.mean_acceptance_length > 2


def test_sampled_output_is_lossless_end_to_end(dtype_model, monkeypatch):
    """The first three emitted tokens, sampled with RS (K=2) through the engine, follow the exact
    target distribution: x1 ~ p(.|prompt) and, for the most frequent x1, x2 ~ p(.|prompt, x1),
    each by a chi-square test over cells with expected count >= 10 (the rest pooled) at
    alpha = 1e-6: false-failure probability about 2e-6 per dtype, 4e-6 in all."""
    params = SamplingParams(1.5, top_k=8)
    prompt = CHAR_CODEC.encode("hello")
    n = 4000
    monkeypatch.setattr(spec, "_draft", mixture_drafter(dtype_model, [prompt] * n, params))
    gens, metrics = spec.speculative_generate(dtype_model, [prompt] * n, k=2, mode="rs", max_new_tokens=3,
                                              sampling=params, generator=torch.Generator().manual_seed(0))
    assert 0.5 < metrics.acceptance_rate < 0.98  # accepted and rejected paths both exercised
    assert_positions_follow(dtype_model, prompt, gens, params, positions=(0, 1))


@pytest.mark.parametrize("mode", ["rs", "to"])
def test_sampled_output_is_lossless_drafting_with_the_head(dtype_model, mode):
    """The same law with the model's own head drafting: each drafting step runs whole (spec_step.speculative_step,
    one graph on the compiled path), so its drafts, warps, draws and acceptance are checked there too. At T=3 this
    random head's q is far enough from p (RS accepts about half its drafts) that accepting too often or resampling
    from the wrong residual moves the law. Chi-square at alpha = 1e-6 per position: false-failure probability about
    3e-6 per (path, mode), about 2e-5 in all."""
    params = SamplingParams(3.0)
    prompt = CHAR_CODEC.encode("hello")
    n = 4000
    gens, metrics = spec.speculative_generate(dtype_model, [prompt] * n, k=2, mode=mode, max_new_tokens=3,
                                              sampling=params, generator=torch.Generator().manual_seed(5))
    low = 0.2 if mode == "rs" else 0.002  # TO accepts only where the head's argmax is the target's sample
    assert low < metrics.acceptance_rate < 0.98 and metrics.num_drafts >= n, metrics.acceptance_rate  # both paths
    assert_marginals_follow(dtype_model, prompt, gens, params, positions=3)


# compiled: its graphs compile cold in a fresh store (minutes); the compiled step's sampling stays in the default suite
# through test_sampled_output_is_lossless_drafting_with_the_head and test_sampled_output_is_lossless_end_to_end
@pytest.mark.parametrize("dtype_model", [pytest.param(path, marks=[pytest.mark.slow] if path == "compiled" else [])
                                         for path in PATHS], indirect=True)
def test_a_whole_step_samples_what_its_two_verbs_sample(dtype_model, monkeypatch):
    """A drafting step run whole (one call; one graph when compiled) and the same step as the drafting chain then the
    verify (what the engine runs for any other drafter) draw the same tokens from the same seed: the step's uniforms
    reach the same draws and tests in both."""
    prompts = ids_of(PROMPTS)
    kwargs = dict(k=3, mode="rs", max_new_tokens=30, sampling=SamplingParams(1.0), stop_ids=[EOS])
    whole, _ = spec.speculative_generate(dtype_model, prompts, generator=torch.Generator().manual_seed(7), **kwargs)
    monkeypatch.setattr(spec, "_draft", lambda *args: spec._HEAD_DRAFT(*args))  # the head's drafts, step in two
    verbs, metrics = spec.speculative_generate(dtype_model, prompts, generator=torch.Generator().manual_seed(7),
                                               **kwargs)
    assert [g.token_ids for g in whole] == [g.token_ids for g in verbs] and metrics.num_drafts > 0


def test_logprobs_are_the_targets(spec_model):
    params = SamplingParams(0.9)
    prompt = CHAR_CODEC.encode("Q: 12 + 7 = ?")
    gens, _ = spec.speculative_generate(spec_model, [prompt], k=3, mode="rs", max_new_tokens=20, sampling=params,
                                        generator=torch.Generator().manual_seed(3))
    seq = torch.tensor([prompt + gens[0].token_ids])
    with torch.no_grad():
        probs = warp_probs(spec_model.logits(spec_model(seq))[0], params)
    n = len(prompt)
    for i, (tok, lp) in enumerate(zip(gens[0].token_ids, gens[0].logprobs)):
        assert abs(torch.log(probs[n - 1 + i, tok]).item() - lp) < 1e-4


def test_metrics_definitions():
    from bebop.engine.metrics import SpecMetrics

    m = SpecMetrics(3)
    for a in (3, 0, 1, 2):
        m.record_draft(a)
    assert m.num_drafts == 4 and m.num_draft_tokens == 12 and m.num_accepted_tokens == 6
    assert m.acceptance_rate == 0.5 and m.mean_acceptance_length == 2.5
    assert m.acceptance_rate_per_position == [0.75, 0.5, 0.25]


@pytest.mark.parametrize("kwargs,needle", [(dict(k=0, mode="rs"), "K"), (dict(k=9, mode="rs"), "K"),
                                           (dict(k=2, mode="greedy"), "mode")])
def test_bad_spec_settings(spec_model, kwargs, needle):
    with pytest.raises(BebopError, match=needle):
        spec.speculative_generate(spec_model, ids_of(["a"]), max_new_tokens=3, **kwargs)


def test_model_without_head_points_to_mtp_init(hf_model_dir):
    _, path = hf_model_dir
    with pytest.raises(BebopError, match="bebop mtp init"):
        spec.speculative_generate(load_model(path), ids_of(["a"]), k=2, mode="rs", max_new_tokens=3)


def test_nan_logits_are_a_clear_error(spec_model):
    import copy

    model = copy.deepcopy(spec_model)
    with torch.no_grad():
        model.lm_head.weight[5, 0] = float("nan")
    with pytest.raises(BebopError, match="NaN"):
        spec.speculative_generate(model, ids_of(["abc"]), k=2, mode="rs", max_new_tokens=3)


def test_nan_in_the_head_alone_is_a_clear_error(spec_model):
    import copy

    model = copy.deepcopy(spec_model)
    with torch.no_grad():
        model.mtp.fc.weight[0, 0] = float("nan")
    with pytest.raises(BebopError, match="NaN"):
        spec.speculative_generate(model, ids_of(["abc"]), k=2, mode="rs", max_new_tokens=6,
                                  sampling=SamplingParams(1.0), generator=torch.Generator().manual_seed(0))
