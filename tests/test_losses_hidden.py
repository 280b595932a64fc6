"""The draft loss from hidden states (bebop.losses.hidden): equal in value and gradient to `draft_loss`
on the full logits for every loss, masks and chunk sizes; the LM-head weight's gradient; bf16 autocast
on purpose; and peak memory that does not grow with N * K * V (torch's CPU allocator, via the profiler)."""

import sys
from pathlib import Path

import pytest
import torch

from bebop.errors import BebopError
from bebop.losses import DRAFT_LOSSES, DraftHiddenInputs, DraftLossInputs, draft_loss, draft_loss_from_hidden

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from common import peak_cpu_bytes  # noqa: E402

NAMES = list(DRAFT_LOSSES)


def random_hidden(n=9, k=3, h=6, v=13, seed=0, dtype=torch.float64):
    """draft_hidden (N, K, H) requiring grad, target_hidden (N, K, H), weight (V, H); logits of a few nats."""
    g = torch.Generator().manual_seed(seed)
    draft = torch.randn(n, k, h, generator=g, dtype=dtype).requires_grad_()
    target = torch.randn(n, k, h, generator=g, dtype=dtype)
    weight = torch.randn(v, h, generator=g, dtype=dtype)
    return draft, target, weight


def full_inputs(draft, target, weight, temperature, mask):
    """The reference: the (N, K, V) logits and probabilities written out."""
    return DraftLossInputs(draft @ weight.T / temperature, torch.softmax(target @ weight.T / temperature, -1), mask)


@pytest.mark.parametrize("weight_grad", [False, True], ids=["frozen-head", "head-grad"])
@pytest.mark.parametrize("name", NAMES)
def test_equals_draft_loss_on_the_full_logits(name, weight_grad):
    """A frozen LM head: per-row gradients taken in forward; one that requires grad: recomputed in backward."""
    draft, target, weight = random_hidden()
    weight.requires_grad_(weight_grad)
    wrt = (draft, weight) if weight_grad else (draft,)
    mask = torch.tensor([True, False, True, True, True, False, True, True, True])  # 7 kept
    want = draft_loss(name, full_inputs(draft, target, weight, 0.7, mask), chunk_size=4)
    g_want = torch.autograd.grad(want.loss, wrt)
    for chunk_size in (1, 3, 4, 64):  # 3 and 4 do not divide the 7 kept chains
        got = draft_loss_from_hidden(name, DraftHiddenInputs(draft, target, weight, 0.7, mask), chunk_size=chunk_size)
        g_got = torch.autograd.grad(got.loss, wrt)
        assert got.loss.item() == pytest.approx(want.loss.item(), rel=1e-12, abs=1e-13)
        for a, b in zip(g_got, g_want):  # grad wrt draft_hidden, and wrt the LM head
            assert torch.allclose(a, b, rtol=1e-10, atol=1e-13)
        assert torch.allclose(got.tv_per_depth, want.tv_per_depth, rtol=1e-12, atol=1e-13)
        assert torch.allclose(got.acceptance_per_depth, want.acceptance_per_depth, rtol=1e-12, atol=1e-13)
        assert got.num_chains == want.num_chains == 7
    assert torch.equal(g_got[0][~mask], torch.zeros_like(g_got[0][~mask]))  # masked chains: exactly zero


@pytest.mark.parametrize("weight_grad", [False, True], ids=["frozen-head", "head-grad"])
@pytest.mark.parametrize("name", ["ce", "rkl", "e2e_tv"])
def test_gradcheck_against_finite_differences(name, weight_grad):
    """Wrt draft_hidden only: a finite difference in the weight also moves the target, which the loss
    holds constant (its weight gradient is checked against draft_loss above)."""
    draft, target, weight = random_hidden(n=5, k=2, h=4, v=7, seed=1)
    weight.requires_grad_(weight_grad)  # True takes the recomputing backward
    mask = torch.tensor([True, True, False, True, True])

    def loss(d):
        return draft_loss_from_hidden(name, DraftHiddenInputs(d, target, weight, 1.3, mask), chunk_size=2).loss

    assert torch.autograd.gradcheck(loss, (draft,), fast_mode=True)


def test_materialise_is_the_same_chains():
    draft, target, weight = random_hidden(seed=2)
    mask = torch.ones(9, dtype=torch.bool)
    got = DraftHiddenInputs(draft, target, weight, 0.5, mask).materialise()
    want = full_inputs(draft, target, weight, 0.5, mask)
    assert torch.allclose(got.draft_logits, want.draft_logits, rtol=1e-12, atol=1e-12)
    assert torch.allclose(got.target_probs, want.target_probs, rtol=1e-12, atol=1e-12)
    assert got.draft_logits.requires_grad and not got.target_probs.requires_grad


def test_masked_chains_are_never_read():
    draft, target, weight = random_hidden(seed=3)
    mask = torch.tensor([True, False, True, False, True, True, True, False, True])
    out = draft_loss_from_hidden("e2e_tv", DraftHiddenInputs(draft, target, weight, 1.0, mask), chunk_size=2)
    (grad,) = torch.autograd.grad(out.loss, draft)
    junk_draft, junk_target = draft.detach().clone(), target.clone()
    junk_draft[~mask], junk_target[~mask] = float("nan"), float("inf")
    junk_draft.requires_grad_()
    junk = draft_loss_from_hidden("e2e_tv", DraftHiddenInputs(junk_draft, junk_target, weight, 1.0, mask), chunk_size=2)
    (junk_grad,) = torch.autograd.grad(junk.loss, junk_draft)
    assert torch.equal(junk.loss, out.loss) and torch.equal(junk_grad, grad)


def test_no_kept_chain_and_a_target_that_requires_grad():
    draft, target, weight = random_hidden(n=3, seed=4)
    out = draft_loss_from_hidden("tv", DraftHiddenInputs(draft, target, weight, 1.0, torch.zeros(3, dtype=torch.bool)))
    out.loss.backward()
    assert out.loss.item() == 0.0 and out.num_chains == 0 and torch.isnan(out.tv_per_depth).all()
    assert torch.equal(draft.grad, torch.zeros_like(draft))
    target_leaf = target.detach().requires_grad_()
    draft_loss_from_hidden("kl", DraftHiddenInputs(draft, target_leaf, weight)).loss.backward()
    assert target_leaf.grad is None  # the target is a constant of the loss
    assert weight.grad is None  # a weight that needs no gradient gets none


def test_under_bf16_autocast_the_products_are_bf16_and_the_rest_float32():
    """Deliberate: the LM-head products take the autocast dtype (as lm_head(x).float() would), the
    softmax and values float32. So fused == unfused under autocast, and both differ from float32."""
    draft, target, weight = random_hidden(n=6, k=2, h=32, v=50, seed=5, dtype=torch.float32)
    weight = weight * 0.5
    inputs = DraftHiddenInputs(draft, target, weight, 1.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = draft_loss_from_hidden("tv", inputs, chunk_size=4)
        want = draft_loss("tv", inputs.materialise(), chunk_size=4)
    assert got.loss.dtype == torch.float32
    g_got, g_want = torch.autograd.grad(got.loss, draft), torch.autograd.grad(want.loss, draft)
    assert got.loss.item() == pytest.approx(want.loss.item(), abs=1e-6)
    assert torch.allclose(g_got[0], g_want[0], rtol=1e-2, atol=1e-5)
    plain = draft_loss_from_hidden("tv", inputs, chunk_size=4)  # float32 products
    assert abs(plain.loss.item() - got.loss.item()) > 1e-5  # bf16 rounding shows: the autocast path was taken


def _fused_step(n, k=2, h=16, v=4096, chunk_size=4):
    draft, target, weight = random_hidden(n=n, k=k, h=h, v=v, seed=6, dtype=torch.float32)
    inputs = DraftHiddenInputs(draft, target, weight, 1.0)
    return lambda: draft_loss_from_hidden("e2e_tv", inputs, chunk_size=chunk_size).loss.backward()


def test_peak_memory_does_not_grow_with_n_k_v():
    """One chunk of 4 chains is 4 * 2 * 4096 * 4 B = 128 KiB per float32 temporary; 1024 chains of full
    logits would be 32 MiB. The fused step's peak stays at a few chunks (and grad_h, 1024 * 2 * 16 * 4 B)."""
    chunk_bytes = 4 * 2 * 4096 * 4
    full_bytes = 1024 * 2 * 4096 * 4
    small, large = peak_cpu_bytes(_fused_step(64)), peak_cpu_bytes(_fused_step(1024))
    assert large < 12 * chunk_bytes + 2 * 1024 * 2 * 16 * 4, (large, chunk_bytes)
    assert large < 1.5 * small, (small, large)
    draft, target, weight = random_hidden(n=1024, k=2, h=16, v=4096, seed=6, dtype=torch.float32)
    full = full_inputs(draft.detach().requires_grad_(), target, weight, 1.0, None)  # the (N, K, V) path
    old = peak_cpu_bytes(lambda: draft_loss("e2e_tv", full, chunk_size=4).loss.backward())
    assert old >= full_bytes  # the meter sees the full gradient of the logits path


@pytest.mark.slow
def test_peak_memory_at_a_real_vocabulary():
    """2048 chains at V = 151,936: full float32 logits would be 1.24 GB, one chunk of 16 chains 9.7 MB per
    temporary; the fused step's peak stays under 8 such temporaries (about 6% of the full logits)."""
    v, n, chunk = 151_936, 2048, 16
    peak = peak_cpu_bytes(_fused_step(n, k=1, h=8, v=v, chunk_size=chunk))
    assert peak < 8 * chunk * v * 4, peak


BAD_H, BAD_T, BAD_W = torch.zeros(4, 2, 6), torch.zeros(4, 2, 6), torch.zeros(11, 6)


@pytest.mark.parametrize("case,message", [
    (lambda: draft_loss_from_hidden("nope", DraftHiddenInputs(BAD_H, BAD_T, BAD_W)), "unknown draft loss 'nope'"),
    (lambda: draft_loss_from_hidden("ce", DraftHiddenInputs(BAD_H[:, 0], BAD_T[:, 0], BAD_W)),
     r"draft_hidden must be \(N, K, H\), got shape \(4, 6\)"),
    (lambda: draft_loss_from_hidden("ce", DraftHiddenInputs(BAD_H, BAD_T[:3], BAD_W)),
     r"target_hidden shape \(3, 2, 6\) does not match"),
    (lambda: draft_loss_from_hidden("ce", DraftHiddenInputs(BAD_H, BAD_T, BAD_W[:, :5])),
     r"lm_head must be \(V, H\) with H = 6, got shape \(11, 5\)"),
    (lambda: draft_loss_from_hidden("ce", DraftHiddenInputs(BAD_H, BAD_T, BAD_W.long())), "must be floating point"),
    (lambda: draft_loss_from_hidden("ce", DraftHiddenInputs(BAD_H, BAD_T, BAD_W, 0.0)),
     "temperature must be a finite number > 0, got 0.0"),
    (lambda: draft_loss_from_hidden("ce", DraftHiddenInputs(BAD_H, BAD_T, BAD_W, mask=torch.ones(4))),
     r"mask must be a bool tensor of shape \(N,\) = \(4,\)"),
    (lambda: draft_loss_from_hidden("ce", DraftHiddenInputs(BAD_H, BAD_T, BAD_W), chunk_size=0),
     "chunk_size must be a positive int"),
])
def test_bad_input_raises_a_bebop_error_naming_the_problem(case, message):
    with pytest.raises(BebopError, match=message):
        case()
