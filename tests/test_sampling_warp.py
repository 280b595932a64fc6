"""Warping logits into the sampled distribution: temperature, top-k, top-p, greedy, entropy."""

import math

import pytest
import torch

from bebop.errors import BebopError
from bebop.sampling import SamplingParams, entropy, sample, token_logprob, warp_probs


def test_hand_worked_top_k_top_p():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert torch.allclose(warp_probs(logits, SamplingParams(1.0, top_k=2)), torch.tensor([0.625, 0.375, 0, 0]))
    # top_p 0.7: 0.5 alone is short of 0.7, 0.5 + 0.3 reaches it -> keep two
    assert torch.allclose(warp_probs(logits, SamplingParams(1.0, top_p=0.7)), torch.tensor([0.625, 0.375, 0, 0]))
    # top_p 0.5 keeps only the first (its mass reaches 0.5)
    assert torch.allclose(warp_probs(logits, SamplingParams(1.0, top_p=0.5)), torch.tensor([1.0, 0, 0, 0]))
    # temperature 2 flattens: probs proportional to sqrt(p)
    root = torch.tensor([0.5, 0.3, 0.15, 0.05]).sqrt()
    assert torch.allclose(warp_probs(logits, SamplingParams(2.0)), root / root.sum())


def test_greedy_is_one_hot_with_zero_entropy_and_logprob():
    logits = torch.randn(4, 7, generator=torch.Generator().manual_seed(0))
    probs = warp_probs(logits, SamplingParams(0.0))
    tokens = sample(probs, torch.Generator().manual_seed(1))
    assert torch.equal(tokens, logits.argmax(-1))
    assert torch.equal(entropy(probs), torch.zeros(4))
    assert torch.equal(token_logprob(probs, tokens), torch.zeros(4))


@pytest.mark.parametrize("params", [SamplingParams(1.0, top_k=3), SamplingParams(0.8, top_p=0.6),
                                    SamplingParams(1.3, top_k=5, top_p=0.5)])
def test_excluded_tokens_are_never_sampled(params):
    logits = torch.randn(64, 20, generator=torch.Generator().manual_seed(2)) * 2
    probs = warp_probs(logits, params)
    allowed = probs > 0
    if params.top_k:
        kth = logits.topk(params.top_k, dim=-1).values[:, -1:]
        assert not (allowed & (logits < kth)).any()  # nothing outside the top k survives
    draws = sample(probs.repeat(200, 1), torch.Generator().manual_seed(3))  # (64*200,)
    assert allowed.repeat(200, 1).gather(1, draws[:, None]).all()


def test_entropy_matches_closed_form():
    probs = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [0.25, 0.25, 0.5]])
    assert torch.allclose(entropy(probs), torch.tensor([math.log(2), 0.0, 1.5 * math.log(2)]))


def test_sampling_frequencies_follow_probs():
    """5-sigma check per cell: false-failure probability about 6e-7 per cell, 4e-6 in all."""
    probs = warp_probs(torch.tensor([1.0, 0.0, -1.0, 0.5]), SamplingParams(0.7))
    n = 100_000
    draws = sample(probs.expand(n, 4), torch.Generator().manual_seed(4))
    freq = torch.bincount(draws, minlength=4).double() / n
    sigma = (probs.double() * (1 - probs.double()) / n).sqrt()
    assert ((freq - probs.double()).abs() <= 5 * sigma).all()


@pytest.mark.parametrize("kwargs,message", [
    (dict(temperature=-1.0), "temperature must be >= 0, got -1.0"), (dict(top_k=-2), r"top_k must be >= 0 \(0 = off\)"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\], got 0.0"), (dict(top_p=1.5), r"top_p must be in \(0, 1\], got 1.5"),
    (dict(temperature=float("nan")), "temperature must be >= 0, got nan")])
def test_bad_params_are_clear_errors(kwargs, message):
    with pytest.raises(BebopError, match=message):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("u", [0.0, 0.5, 1.0 - 2.0 ** -53, 1.0])
def test_inverse_cdf_never_picks_a_token_without_mass_even_at_the_extreme_uniforms(u, monkeypatch):
    """sample draws one float64 uniform a row (issue 24); at u = 0, the largest u below 1 and u = 1 (where
    u * mass rounds to the mass: the guard that stops at the last token with mass), tokens of mass 0
    before, between and after the tokens with mass are never picked."""
    probs = torch.tensor([[0.0, 0.3, 0.0, 0.7, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 1.0], [1e-30, 0.0, 0.0, 0.0, 0.0, 0.0]])
    real_rand = torch.rand
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: real_rand(shape, **kw).fill_(u))
    tokens = sample(probs)
    assert (probs.gather(1, tokens[:, None]) > 0).all()
    assert tokens.tolist()[1:] == [5, 0]


def test_sample_keeps_leading_dimensions():
    probs = torch.softmax(torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(5)), dim=-1)
    tokens = sample(probs, torch.Generator().manual_seed(6))
    assert tokens.shape == (2, 3) and tokens.dtype == torch.int64 and int(tokens.max()) < 11
