"""Lossless draft acceptance (bebop.sampling.acceptance): RS and TO.

Contains the readable per-row reference implementation (`reference_accept`) that the batched,
vectorised package code must match given the same random draws.

Statistical tests use a chi-square goodness-of-fit test at ALPHA = 1e-6 per check. Seeds are fixed,
so every run is deterministic; the stated false-failure probabilities are over the choice of seed
(what a correct implementation risks if the seeds or torch's RNG stream change).
"""

from __future__ import annotations

import pytest
import torch

from bebop.errors import BebopError
from bebop.sampling import SamplingParams, rejection_sample, sample, target_only_sample, warp_probs
from bebop.sampling.acceptance import _rejection_sample_from, _target_only_sample_from

from stats_helpers import ALPHA, grouped_chi2_pvalue

# ---------------------------------------------------------------------------------------------
# Reference: one row at a time, one depth at a time, written to be read.
# ---------------------------------------------------------------------------------------------


def _inverse_cdf_one(weights: torch.Tensor, u: float) -> int:
    """weights (V,) >= 0, u in [0, 1) -> the first token whose float64 cumulative weight exceeds u * sum(w),
    never past the last token with weight (P(v) = w_v / sum w; a weight-0 token has an empty interval)."""
    cdf = torch.cumsum(weights, 0, dtype=torch.float64).tolist()
    target = u * cdf[-1]
    last = max(i for i, w in enumerate(weights.tolist()) if w > 0)
    return min(next((i for i, c in enumerate(cdf) if c > target), last), last)


def reference_accept(rule, draft_tokens, draft_probs, target_probs, uniforms, final):
    """rule 'rs' or 'to'. Same arguments and return values as the package's pure functions."""
    batch, k = draft_tokens.shape
    tokens = torch.full((batch, k + 1), -1, dtype=torch.int64)
    num_accepted = torch.zeros(batch, dtype=torch.int64)
    for b in range(batch):
        emitted = []
        for d in range(k):
            y = int(draft_tokens[b, d])
            p = target_probs[b, d]
            u = float(uniforms[b, d])
            if rule == "rs":
                q = draft_probs[b, d]
                dtype = torch.promote_types(p.dtype, q.dtype)
                p, q = p.to(dtype), q.to(dtype)
                accept = u * float(q[y]) < float(p[y])
            else:
                accept = u < float(p[y])
            if accept:
                emitted.append(y)
                continue
            if rule == "rs":
                residual = (p - q).clamp_min(0.0)  # max(0, p - q)
            else:
                residual = p.clone()
                residual[y] = 0.0  # p with the draft removed
            if not (residual > 0).any():
                residual = p  # no residual mass: fall back to the target row
            emitted.append(_inverse_cdf_one(residual, float(final[b])))  # recovered token
            break
        else:
            emitted.append(_inverse_cdf_one(target_probs[b, k].clone(), float(final[b])))  # bonus token
        num_accepted[b] = len(emitted) - 1
        tokens[b, : len(emitted)] = torch.tensor(emitted)
    return tokens, num_accepted


def _draws(batch, k, vocab, seed):
    """Exactly the draws the public functions make (see the acceptance module docstring)."""
    g = torch.Generator().manual_seed(seed)
    uniforms = torch.rand((batch, k), dtype=torch.float64, generator=g)
    final = torch.rand((batch,), dtype=torch.float64, generator=g)
    return uniforms, final


def chain_pvalues(tokens, num_accepted, target_rows):
    """target_rows (K+1, V): the same p_1..p_{K+1} for every row.

    For each emitted position j (0-based): among rows that emit a token at j (num_accepted >= j),
    grouped by the token emitted at j-1, the token at j must be ~ p_{j+1}. Returns K+1 p-values.
    """
    k_plus_1, vocab = target_rows.shape
    pvalues = []
    for j in range(k_plus_1):
        rows = num_accepted >= j
        current = tokens[rows, j]
        assert (current >= 0).all()
        previous = tokens[rows, j - 1] if j > 0 else torch.zeros_like(current)
        groups = []
        for prev in previous.unique():
            counts = torch.bincount(current[previous == prev], minlength=vocab)
            groups.append((counts, target_rows[j]))
        pvalues.append(grouped_chi2_pvalue(groups))
    return pvalues


# ---------------------------------------------------------------------------------------------
# Statistical cases: (target warping, draft warping), V = 6, K = 3.
# ---------------------------------------------------------------------------------------------

V, K, N = 6, 3, 200_000

CASES = {
    "t0.7": (SamplingParams(temperature=0.7), SamplingParams(temperature=0.7)),
    "t1.5": (SamplingParams(temperature=1.5), SamplingParams(temperature=1.5)),
    # target top-k zeros tokens the draft may propose (p = 0 must never be accepted)
    "target_topk": (SamplingParams(temperature=0.7, top_k=3), SamplingParams(temperature=1.5)),
    # draft top-k zeros tokens the target likes (only reachable through recovery)
    "draft_topk_target_topp": (SamplingParams(temperature=1.5, top_p=0.8), SamplingParams(temperature=0.7, top_k=2)),
    "both_topp": (SamplingParams(temperature=1.5, top_p=0.9), SamplingParams(temperature=1.5, top_k=4, top_p=0.7)),
}


def _case(name: str, seed: int):
    """Fixed p rows (K+1, V) and q rows (K, V); q's logits are p's plus noise (moderate acceptance)."""
    target_params, draft_params = CASES[name]
    g = torch.Generator().manual_seed(seed)
    target_logits = 1.5 * torch.randn((K + 1, V), generator=g)
    draft_logits = target_logits[:K] + 0.8 * torch.randn((K, V), generator=g)
    return warp_probs(target_logits, target_params), warp_probs(draft_logits, draft_params), draft_logits


def _run_rs(target_rows, draft_rows, seed, claimed_draft_rows=None):
    """N chains with drafts sampled from draft_rows; claimed_draft_rows is what RS is told q is."""
    g = torch.Generator().manual_seed(seed)
    draft_probs = draft_rows.expand(N, K, V)
    draft_tokens = sample(draft_probs, generator=g)  # (N, K)
    claimed = draft_probs if claimed_draft_rows is None else claimed_draft_rows.expand(N, K, V)
    return rejection_sample(draft_tokens, claimed, target_rows.expand(N, K + 1, V), generator=g)


def _run_to(target_rows, draft_rows, seed):
    g = torch.Generator().manual_seed(seed)
    draft_tokens = draft_rows.argmax(dim=-1).expand(N, K)  # greedy drafts
    return target_only_sample(draft_tokens, target_rows.expand(N, K + 1, V), generator=g)


@pytest.mark.parametrize("name", sorted(CASES))
def test_rs_is_lossless(name):
    """Every emitted position (K+1 = 4 checks, conditioned on the previous token) ~ target.

    False-failure probability: at most 4 * ALPHA = 4e-6 per case, 2e-5 over the 5 cases.
    """
    target_rows, draft_rows, _ = _case(name, seed=1)
    tokens, num_accepted = _run_rs(target_rows, draft_rows, seed=2)
    assert int(num_accepted.min()) >= 0 and int(num_accepted.max()) <= K
    assert (num_accepted == K).any() and (num_accepted < K).any()
    pvalues = chain_pvalues(tokens, num_accepted, target_rows)
    assert min(pvalues) > ALPHA, pvalues


@pytest.mark.parametrize("name", sorted(CASES))
def test_to_is_lossless(name):
    """Every emitted position (4 checks, conditioned on the previous token) ~ target.

    False-failure probability: at most 4 * ALPHA = 4e-6 per case, 2e-5 over the 5 cases.
    """
    target_rows, draft_rows, _ = _case(name, seed=3)
    tokens, num_accepted = _run_to(target_rows, draft_rows, seed=4)
    pvalues = chain_pvalues(tokens, num_accepted, target_rows)
    assert min(pvalues) > ALPHA, pvalues


def test_chi_square_check_has_power_against_lossy_rules():
    """The same check must REJECT known-lossy rules (otherwise the lossless tests prove nothing).

    1. RS told the wrong q (drafts sampled at T=0.7, RS given q at T=1.5; method.md section 7).
    2. TO that resamples from the full p_d on rejection instead of p_d with y_d removed.
    3. 'Accept if an independent target sample equals the draft', recovering from the full p_d.
    Each bias is large (several % of mass) at N = 200k, so the chance that a lossy rule passes is
    astronomically small (p-values observed ~1e-100 or below).
    """
    target_rows, draft_rows, draft_logits = _case("t1.5", seed=5)
    sampled_rows = warp_probs(draft_logits, SamplingParams(temperature=0.7))
    claimed_rows = warp_probs(draft_logits, SamplingParams(temperature=1.5))
    tokens, num_accepted = _run_rs(target_rows, sampled_rows, seed=6, claimed_draft_rows=claimed_rows)
    assert min(chain_pvalues(tokens, num_accepted, target_rows)) < ALPHA

    # Lossy TO: one depth is enough; build it from the same draws the real TO would use.
    g = torch.Generator().manual_seed(7)
    p1 = target_rows[0]
    y = int(draft_rows[0].argmax())
    u = torch.rand(N, dtype=torch.float64, generator=g)
    resampled = torch.multinomial(p1, N, replacement=True, generator=g)
    first = torch.where(u < float(p1[y]), torch.full_like(resampled, y), resampled)
    assert grouped_chi2_pvalue([(torch.bincount(first, minlength=V), p1)]) < ALPHA

    # 'Two independent samples agree': draft y ~ q, x ~ p, accept iff x == y, else a fresh p sample.
    y = torch.multinomial(draft_rows[0], N, replacement=True, generator=g)
    x = torch.multinomial(p1, N, replacement=True, generator=g)
    fresh = torch.multinomial(p1, N, replacement=True, generator=g)
    first = torch.where(x == y, y, fresh)
    assert grouped_chi2_pvalue([(torch.bincount(first, minlength=V), p1)]) < ALPHA


# ---------------------------------------------------------------------------------------------
# Deterministic properties.
# ---------------------------------------------------------------------------------------------


def _greedy_expected(target_probs, draft_tokens):
    """Plain greedy decoding over the same target rows: drafts kept up to the first mismatch."""
    k = draft_tokens.shape[1]
    best = target_probs.argmax(dim=-1)  # (B, K+1)
    matches = (draft_tokens == best[:, :k]).long().cumprod(dim=1)  # (B, K)
    num = matches.sum(dim=1)
    expected = torch.full_like(best, -1)
    for b in range(best.shape[0]):
        expected[b, : num[b] + 1] = best[b, : num[b] + 1]
    return expected, num


def test_temperature_zero_equals_greedy():
    batch, k, vocab = 257, 4, 9
    g = torch.Generator().manual_seed(11)
    target_probs = warp_probs(torch.randn((batch, k + 1, vocab), generator=g), SamplingParams(temperature=0.0))
    best = target_probs.argmax(dim=-1)[:, :k]
    random_tokens = torch.randint(0, vocab, (batch, k), generator=g)
    keep = torch.rand((batch, k), generator=g) < 0.75  # ragged first-mismatch depths
    draft_tokens = torch.where(keep, best, random_tokens)
    expected, expected_num = _greedy_expected(target_probs, draft_tokens)
    assert len(expected_num.unique()) == k + 1

    # TO, and RS with one-hot greedy q and with a soft q.
    for tokens, num in [
        target_only_sample(draft_tokens, target_probs, generator=g),
        rejection_sample(draft_tokens, torch.nn.functional.one_hot(draft_tokens, vocab).float(), target_probs, generator=g),
        rejection_sample(draft_tokens, torch.softmax(torch.randn((batch, k, vocab), generator=g), -1), target_probs, generator=g),
    ]:
        assert torch.equal(num, expected_num)
        assert torch.equal(tokens, expected)


def test_zero_target_probability_never_accepted_even_with_zero_uniform():
    batch, k, vocab = 64, 3, 7
    g = torch.Generator().manual_seed(12)
    target_probs = torch.softmax(torch.randn((batch, k + 1, vocab), generator=g), -1)
    draft_tokens = torch.randint(0, vocab, (batch, k), generator=g)
    target_probs[:, :k].scatter_(-1, draft_tokens.unsqueeze(-1), 0.0)  # p_d(y_d) = 0 everywhere
    draft_probs = torch.softmax(torch.randn((batch, k, vocab), generator=g), -1)
    uniforms = torch.zeros((batch, k), dtype=torch.float64)  # the coin that bit SGLang (#35771)
    final = torch.rand((batch,), dtype=torch.float64, generator=g)
    for tokens, num in [
        _rejection_sample_from(draft_tokens, draft_probs, target_probs, uniforms, final),
        # q(y) = 0 as well: 0 * 0 < 0 is still false
        _rejection_sample_from(draft_tokens, torch.zeros_like(draft_probs), target_probs, uniforms, final),
        _target_only_sample_from(draft_tokens, target_probs, uniforms, final),
    ]:
        assert (num == 0).all()
        assert (tokens[:, 1:] == -1).all()
        assert (target_probs[:, 0].gather(-1, tokens[:, :1]) > 0).all()  # the recovered token has mass


def test_draft_equal_to_target_accepts_everything():
    batch, k, vocab = 4096, 3, 50
    g = torch.Generator().manual_seed(13)
    probs = warp_probs(torch.randn((batch, k + 1, vocab), generator=g), SamplingParams(temperature=1.0, top_k=20))
    draft_probs = probs[:, :k].clone()
    draft_tokens = sample(draft_probs, generator=g)
    tokens, num = rejection_sample(draft_tokens, draft_probs, probs, generator=g)
    assert (num == k).all()
    assert torch.equal(tokens[:, :k], draft_tokens)
    assert (probs[:, k].gather(-1, tokens[:, k:]) > 0).all()  # bonus from p_{K+1}'s support


def test_residual_without_mass_falls_back_to_target():
    """p_d == q_d but the draft has p_d(y_d) = 0 (only reachable with inconsistent inputs):
    the residual is all zero, so the recovered token is drawn from p_d."""
    batch, k, vocab = 128, 2, 8
    g = torch.Generator().manual_seed(14)
    probs = warp_probs(torch.randn((batch, k + 1, vocab), generator=g), SamplingParams(top_k=3))
    draft_tokens = probs[:, :k].argmin(dim=-1)  # p = 0 there
    uniforms, final = _draws(batch, k, vocab, seed=15)
    tokens, num = _rejection_sample_from(draft_tokens, probs[:, :k], probs, uniforms, final)
    assert (num == 0).all()
    assert (probs[:, 0].gather(-1, tokens[:, :1]) > 0).all()
    expected = [_inverse_cdf_one(probs[b, 0], float(final[b])) for b in range(batch)]
    assert tokens[:, 0].tolist() == expected


@pytest.mark.parametrize("name", ["t0.7", "target_topk", "draft_topk_target_topp"])
def test_rs_depth_one_acceptance_is_one_minus_tv(name):
    """Depth-1 acceptance ~ Binomial(N, sum_v min(p_v, q_v)); tolerance 5 sigma.

    False-failure probability: 5.7e-7 per case (two-sided normal tail at 5 sigma), < 2e-6 total.
    Also checks TO's depth-1 acceptance p_1(argmax q_1) with the same tolerance (another 5.7e-7).
    """
    target_rows, draft_rows, _ = _case(name, seed=16)
    _, num = _run_rs(target_rows, draft_rows, seed=17)
    alpha = float(torch.minimum(target_rows[0], draft_rows[0]).sum())
    sigma = (alpha * (1 - alpha) / N) ** 0.5
    measured = float((num >= 1).double().mean())
    assert abs(measured - alpha) < 5 * sigma, (measured, alpha, sigma)

    _, num = _run_to(target_rows, draft_rows, seed=18)
    alpha = float(target_rows[0, draft_rows[0].argmax()])
    sigma = max((alpha * (1 - alpha) / N) ** 0.5, 1e-12)
    measured = float((num >= 1).double().mean())
    assert abs(measured - alpha) < 5 * sigma, (measured, alpha, sigma)


# ---------------------------------------------------------------------------------------------
# Batched == per-row loop, on a large batch with ragged acceptance (vLLM #14645).
# ---------------------------------------------------------------------------------------------


def _ragged_batch(batch, k, vocab, seed, dtype):
    """Rows of four kinds: q == p (accept all), q near p, q unrelated, p == q with p(y) = 0."""
    g = torch.Generator().manual_seed(seed)
    target_logits = 2.0 * torch.randn((batch, k + 1, vocab), generator=g)
    target_probs = warp_probs(target_logits, SamplingParams(temperature=1.0, top_k=vocab - 2)).to(dtype)
    near = warp_probs(target_logits[:, :k] + 0.7 * torch.randn((batch, k, vocab), generator=g), SamplingParams(top_p=0.9))
    unrelated = warp_probs(torch.randn((batch, k, vocab), generator=g), SamplingParams(temperature=1.3))
    kind = torch.arange(batch) % 4
    draft_probs = torch.where(
        (kind == 0).view(-1, 1, 1), target_probs[:, :k].float(), torch.where((kind == 1).view(-1, 1, 1), near, unrelated)
    ).to(dtype)
    draft_probs[kind == 3] = target_probs[kind == 3, :k]
    draft_tokens = sample(draft_probs.float(), generator=g)
    # kind 3: the first draft has p = q = 0 (never accepted, residual empty -> fallback to p)
    draft_tokens[kind == 3, 0] = target_probs[kind == 3, 0].argmin(dim=-1)
    return draft_tokens, draft_probs, target_probs


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_batched_equals_per_row_loop(dtype):
    batch, k, vocab = 257, 4, 7
    draft_tokens, draft_probs, target_probs = _ragged_batch(batch, k, vocab, seed=21, dtype=dtype)
    uniforms, final = _draws(batch, k, vocab, seed=22)

    got = _rejection_sample_from(draft_tokens, draft_probs, target_probs, uniforms, final)
    want = reference_accept("rs", draft_tokens, draft_probs, target_probs, uniforms, final)
    assert set(want[1].tolist()) == set(range(k + 1)), "want ragged acceptance: every count 0..K"
    assert torch.equal(got[1], want[1])
    assert torch.equal(got[0], want[0])

    greedy = draft_probs.argmax(dim=-1)
    got = _target_only_sample_from(greedy, target_probs, uniforms, final)
    want = reference_accept("to", greedy, None, target_probs, uniforms, final)
    assert len(want[1].unique()) >= 3
    assert torch.equal(got[1], want[1])
    assert torch.equal(got[0], want[0])

    # The public functions make exactly the documented draws.
    got = rejection_sample(draft_tokens, draft_probs, target_probs, generator=torch.Generator().manual_seed(22))
    want = reference_accept("rs", draft_tokens, draft_probs, target_probs, uniforms, final)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    got = target_only_sample(greedy, target_probs, generator=torch.Generator().manual_seed(22))
    want = reference_accept("to", greedy, None, target_probs, uniforms, final)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_output_layout():
    batch, k, vocab = 257, 4, 7
    draft_tokens, draft_probs, target_probs = _ragged_batch(batch, k, vocab, seed=23, dtype=torch.float32)
    tokens, num = rejection_sample(draft_tokens, draft_probs, target_probs, generator=torch.Generator().manual_seed(1))
    assert tokens.shape == (batch, k + 1) and tokens.dtype == torch.int64
    assert num.shape == (batch,) and num.dtype == torch.int64
    position = torch.arange(k + 1).unsqueeze(0)
    assert torch.equal(tokens == -1, position > num.unsqueeze(1))  # exactly num + 1 tokens, then -1
    assert torch.equal(tokens[:, :k][position[:, :k] < num.unsqueeze(1)], draft_tokens[position[:, :k] < num.unsqueeze(1)])


# ---------------------------------------------------------------------------------------------
# Bad input.
# ---------------------------------------------------------------------------------------------


def _good(batch=2, k=3, vocab=5):
    probs = torch.full((batch, k + 1, vocab), 1.0 / vocab)
    return torch.zeros((batch, k), dtype=torch.int64), probs[:, :k].clone(), probs


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda t, q, p: (t, q, p[:, :-1]), "shape mismatch"),  # target has K rows, not K+1
        (lambda t, q, p: (t, q[:, :-1], p), "shape mismatch"),  # draft_probs has K-1 rows
        (lambda t, q, p: (t[:, :-1], q, p), "shape mismatch"),  # K mismatch with the probs
        (lambda t, q, p: (t[:1], q, p), "shape mismatch"),  # B mismatch
        (lambda t, q, p: (t, q[..., :-1], p), "shape mismatch"),  # V mismatch
        (lambda t, q, p: (t[0], q, p), "bad shapes"),  # draft_tokens not 2-D
        (lambda t, q, p: (t, q, p[0]), "bad shapes"),  # target_probs not 3-D
        (lambda t, q, p: (t[:, :0], q[:, :0], p[:, :1]), "K >= 1"),
        (lambda t, q, p: (t.int(), q, p), "int64"),
        (lambda t, q, p: (t, q, p.long()), "floating point"),
        (lambda t, q, p: (t, q.long(), p), "floating point"),
    ],
)
def test_bad_input_raises_bebop_error(mutate, match):
    draft_tokens, draft_probs, target_probs = mutate(*_good())
    with pytest.raises(BebopError, match=match) as info:
        rejection_sample(draft_tokens, draft_probs, target_probs)
    message = str(info.value)
    assert "\n" not in message
    if "shape" in match:  # names both shapes
        assert str(tuple(target_probs.shape)) in message and str(tuple(draft_tokens.shape)) in message


def test_bad_input_target_only():
    draft_tokens, _, target_probs = _good()
    with pytest.raises(BebopError, match=r"draft_tokens \(2, 3\), target_probs \(2, 3, 5\)"):
        target_only_sample(draft_tokens, target_probs[:, :-1])


# ---------------------------------------------------------------------------------------------
# No host synchronisation.
# ---------------------------------------------------------------------------------------------


def test_no_host_sync_runs_on_meta_tensors():
    """Meta tensors carry no data: any .item(), .tolist() or branch on a tensor value would raise."""
    batch, k, vocab = 5, 3, 7
    draft_tokens = torch.zeros((batch, k), dtype=torch.int64, device="meta")
    draft_probs = torch.empty((batch, k, vocab), device="meta")
    target_probs = torch.empty((batch, k + 1, vocab), device="meta")
    for tokens, num in [
        rejection_sample(draft_tokens, draft_probs, target_probs),
        target_only_sample(draft_tokens, target_probs),
    ]:
        assert tokens.shape == (batch, k + 1) and tokens.dtype == torch.int64
        assert num.shape == (batch,) and num.dtype == torch.int64


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_no_host_sync_on_cuda():
    batch, k, vocab = 257, 4, 7
    draft_tokens, draft_probs, target_probs = _ragged_batch(batch, k, vocab, seed=24, dtype=torch.float32)
    draft_tokens, draft_probs, target_probs = draft_tokens.cuda(), draft_probs.cuda(), target_probs.cuda()
    generator = torch.Generator(device="cuda").manual_seed(0)
    torch.cuda.set_sync_debug_mode("error")
    try:
        rejection_sample(draft_tokens, draft_probs, target_probs, generator=generator)
        target_only_sample(draft_tokens, target_probs, generator=generator)
    finally:
        torch.cuda.set_sync_debug_mode("default")
