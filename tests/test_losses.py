"""Draft losses (bebop.losses): hand values, gradients vs closed forms and vs autograd of a plain
reference, chunked == unchunked, masks, detached targets, bad input."""

import math

import pytest
import torch

from bebop.errors import BebopError
from bebop.losses import DRAFT_LOSSES, DraftLossInputs, ce_loss, draft_loss, e2e_tv_loss, kl_loss, rkl_loss, tv_loss

ROW_FNS = {"ce": ce_loss, "kl": kl_loss, "rkl": rkl_loss, "tv": tv_loss}
NAMES = ["ce", "kl", "rkl", "tv", "e2e_tv"]


# ---- plain, readable reference (autograd does the gradients) ------------------------------------

def ref_rows(name, logits, target):
    """(..., V), (..., V) -> (...) straight from the definitions."""
    logq = torch.log_softmax(logits, dim=-1)
    q = logq.exp()
    if name == "ce":
        return -(target * logq).sum(-1)
    if name == "kl":
        return (target * (target.log() - logq)).sum(-1)  # test targets are strictly positive
    if name == "rkl":
        return (q * (logq - target.clamp_min(1e-12).log())).sum(-1)
    return 0.5 * (target - q).abs().sum(-1)  # tv, written the other way on purpose


def ref_draft_loss(name, logits, target, mask):
    """(N, K, V) chains, one Python loop over chains, mean over kept chains."""
    losses = []
    for n in range(logits.shape[0]):
        if not mask[n]:
            continue
        if name == "e2e_tv":
            tv = ref_rows("tv", logits[n], target[n])  # (K,)
            accepted, survive = 0.0, 1.0
            for depth_tv in tv:
                survive = survive * (1 - depth_tv)
                accepted = accepted + survive
            losses.append(1 - accepted / len(tv))
        else:
            losses.append(ref_rows(name, logits[n], target[n]).mean())
    return torch.stack(losses).mean()


def random_chains(n=7, k=3, v=11, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, k, v, generator=g, dtype=dtype) * 2).requires_grad_()
    target = torch.softmax(torch.randn(n, k, v, generator=g, dtype=dtype) * 2, dim=-1)
    return logits, target


# ---- hand-checked values on a 3-token vocabulary ----------------------------------------------

# q = softmax(log(0.2, 0.3, 0.5)) = (0.2, 0.3, 0.5) exactly; p = (0.5, 0.3, 0.2).
Q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
P = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
HAND = {
    # ce = -(0.5 log 0.2 + 0.3 log 0.3 + 0.2 log 0.5);  grad q - p = (-0.3, 0, 0.3)
    "ce": (0.5 * math.log(5) - 0.3 * math.log(0.3) + 0.2 * math.log(2), [-0.3, 0.0, 0.3]),
    # kl = ce - H(p) = 0.5 log(0.5/0.2) + 0.3 log 1 + 0.2 log(0.2/0.5) = 0.3 log 2.5;  grad q - p
    "kl": (0.3 * math.log(2.5), [-0.3, 0.0, 0.3]),
    # rkl = 0.2 log(0.2/0.5) + 0.3 log 1 + 0.5 log(0.5/0.2) = 0.3 log 2.5 (= kl here, by symmetry)
    # grad_j = q_j (log(q_j/p_j) - rkl): (0.2 (log 0.4 - r), 0.3 (0 - r), 0.5 (log 2.5 - r))
    "rkl": (0.3 * math.log(2.5), [0.2 * (math.log(0.4) - 0.3 * math.log(2.5)), -0.3 * 0.3 * math.log(2.5),
                                  0.5 * (math.log(2.5) - 0.3 * math.log(2.5))]),
    # tv = 1 - (0.2 + 0.3 + 0.2) = 0.3. Token 1 is a tie (q = p = 0.3): it counts in S.
    # S = 0.2 + 0.3 = 0.5; grad_j = q_j (S - 1 + [q_j > p_j]) = (0.2 * -0.5, 0.3 * -0.5, 0.5 * 0.5)
    "tv": (0.3, [-0.1, -0.15, 0.25]),
}


@pytest.mark.parametrize("name", list(ROW_FNS))
def test_hand_values_and_gradients_3_tokens(name):
    logits = Q.log().unsqueeze(0).requires_grad_()  # (1, 3)
    value = ROW_FNS[name](logits, P.unsqueeze(0))
    value.sum().backward()
    want_value, want_grad = HAND[name]
    assert value.shape == (1,)
    assert value.item() == pytest.approx(want_value, abs=1e-12)
    assert torch.allclose(logits.grad[0], torch.tensor(want_grad, dtype=torch.float64), rtol=1e-10, atol=1e-12)


def test_e2e_tv_hand_value_k2():
    # depth 1: q = (0.2, 0.3, 0.5), p = (0.5, 0.3, 0.2): TV_1 = 0.3
    # depth 2: q = (0.25, 0.25, 0.5), p = (0.5, 0.5, 0): TV_2 = 0.5 * (0.25 + 0.25 + 0.5) = 0.5
    # e2e = 1 - (1/2) ((1 - 0.3) + (1 - 0.3)(1 - 0.5)) = 1 - (0.7 + 0.35) / 2 = 0.475
    q = torch.tensor([[0.2, 0.3, 0.5], [0.25, 0.25, 0.5]], dtype=torch.float64)
    p = torch.tensor([[0.5, 0.3, 0.2], [0.5, 0.5, 0.0]], dtype=torch.float64)
    logits = q.log().unsqueeze(0).requires_grad_()  # (N=1, K=2, V=3)
    out = draft_loss("e2e_tv", DraftLossInputs(logits, p.unsqueeze(0)))
    assert out.loss.item() == pytest.approx(0.475, abs=1e-12)
    assert torch.allclose(out.tv_per_depth, torch.tensor([0.3, 0.5], dtype=torch.float64))
    assert torch.allclose(out.acceptance_per_depth, torch.tensor([0.7, 0.5], dtype=torch.float64))
    assert out.num_chains == 1 and not out.tv_per_depth.requires_grad
    assert e2e_tv_loss(logits, p.unsqueeze(0)).item() == pytest.approx(0.475, abs=1e-12)
    # the per-depth tv loss on the same chain is the plain mean (0.3 + 0.5) / 2
    assert draft_loss("tv", DraftLossInputs(logits, p.unsqueeze(0))).loss.item() == pytest.approx(0.4, abs=1e-12)
    # gradient: d loss / d TV_1 = (1/2)((1) + (1 - TV_2)) = 0.75, d loss / d TV_2 = (1/2)(1 - TV_1) = 0.35,
    # times each depth's tv gradient (all ties avoided except token 1 of depth 1, handled as above)
    out.loss.backward()
    grad_tv1 = torch.tensor([-0.1, -0.15, 0.25], dtype=torch.float64)
    # depth 2: q <= p for tokens 0, 1: S = 0.5; grad = q (S - 1 + [q > p]) = (-0.125, -0.125, 0.25)
    grad_tv2 = torch.tensor([-0.125, -0.125, 0.25], dtype=torch.float64)
    assert torch.allclose(logits.grad[0], torch.stack([0.75 * grad_tv1, 0.35 * grad_tv2]), rtol=1e-10, atol=1e-12)


# ---- gradients ------------------------------------------------------------------------------------

def closed_form_grad(name, logits, target):
    """The table in method.md section 4, written out independently."""
    q = torch.softmax(logits, dim=-1)
    if name in ("ce", "kl"):
        return q - target
    if name == "rkl":
        log_ratio = (q / target).log()
        return q * (log_ratio - (q * log_ratio).sum(-1, keepdim=True))
    s = (q * (q <= target)).sum(-1, keepdim=True)
    return q * (s - 1 + (q > target).double())


@pytest.mark.parametrize("name", list(ROW_FNS))
def test_row_gradients_match_closed_forms(name):
    logits, target = random_chains(n=9, k=1, v=13, seed=1)
    logits, target = logits[:, 0].detach().requires_grad_(), target[:, 0]
    (grad,) = torch.autograd.grad(ROW_FNS[name](logits, target).sum(), logits)
    assert torch.allclose(grad, closed_form_grad(name, logits.detach(), target), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", list(ROW_FNS))
def test_row_losses_match_reference_and_gradcheck(name):
    logits, target = random_chains(n=4, k=1, v=7, seed=2)
    logits = logits[:, 0].detach().requires_grad_()
    target = target[:, 0]
    weights = torch.linspace(0.5, 2.0, 4, dtype=torch.float64)  # a non-uniform upstream gradient
    got = ROW_FNS[name](logits, target)
    want = ref_rows(name, logits, target)
    assert torch.allclose(got, want, rtol=1e-10, atol=1e-12)
    g_got = torch.autograd.grad((got * weights).sum(), logits)[0]
    g_want = torch.autograd.grad((want * weights).sum(), logits)[0]
    assert torch.allclose(g_got, g_want, rtol=1e-10, atol=1e-12)
    # |q - p| is far from 0 on this data, so finite differences never cross a TV kink
    assert (torch.softmax(logits, -1) - target).abs().min() > 1e-4
    assert torch.autograd.gradcheck(lambda z: ROW_FNS[name](z, target, chunk_size=3), (logits,))


@pytest.mark.parametrize("name", NAMES)
def test_draft_loss_matches_reference_and_gradcheck(name):
    logits, target = random_chains(n=6, k=3, v=7, seed=3)
    mask = torch.tensor([True, False, True, True, False, True])
    out = draft_loss(name, DraftLossInputs(logits, target, mask), chunk_size=4)
    want = ref_draft_loss(name, logits, target, mask)
    assert out.loss.item() == pytest.approx(want.item(), abs=1e-12)
    g_got = torch.autograd.grad(out.loss, logits)[0]
    g_want = torch.autograd.grad(want, logits)[0]
    assert torch.allclose(g_got, g_want, rtol=1e-10, atol=1e-12)
    assert out.num_chains == 4
    want_tv = ref_rows("tv", logits, target)[mask].mean(0)
    assert torch.allclose(out.tv_per_depth, want_tv, rtol=1e-10, atol=1e-12)
    assert torch.allclose(out.acceptance_per_depth, 1 - want_tv, rtol=1e-10, atol=1e-12)
    # fast mode (a random projection of the Jacobian): the full one costs ~250 forward calls
    assert torch.autograd.gradcheck(
        lambda z: draft_loss(name, DraftLossInputs(z, target, mask), chunk_size=3).loss, (logits,), fast_mode=True)


# ---- chunking -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_chunked_equals_unchunked(name):
    logits, target = random_chains(n=10, k=4, v=17, seed=4)
    mask = torch.ones(10, dtype=torch.bool)
    mask[[2, 7]] = False
    whole = draft_loss(name, DraftLossInputs(logits, target, mask), chunk_size=10)
    (g_whole,) = torch.autograd.grad(whole.loss, logits)
    for chunk_size in (1, 2, 3, 4, 7, 64):  # 3, 4 and 7 do not divide the 8 kept (or 10) chains
        out = draft_loss(name, DraftLossInputs(logits, target, mask), chunk_size=chunk_size)
        (grad,) = torch.autograd.grad(out.loss, logits)
        assert torch.allclose(out.loss, whole.loss, rtol=0, atol=1e-13)
        assert torch.allclose(grad, g_whole, rtol=0, atol=1e-13)
        assert torch.allclose(out.tv_per_depth, whole.tv_per_depth, rtol=0, atol=1e-13)
    if name in ROW_FNS:
        flat_logits = logits.detach().reshape(40, 17).requires_grad_()
        ref = ROW_FNS[name](flat_logits, target.reshape(40, 17), chunk_size=40)
        for chunk_size in (1, 3, 9):
            assert torch.allclose(ROW_FNS[name](flat_logits, target.reshape(40, 17), chunk_size=chunk_size), ref,
                                  rtol=0, atol=1e-13)


@pytest.mark.parametrize("name", NAMES)
def test_autograd_saves_no_full_size_activation(name):
    """The memory claim: the graph keeps only the inputs themselves at (N, K, V) size."""
    logits, target = random_chains(n=12, k=3, v=50, seed=9)
    inputs = {logits.data_ptr(), target.data_ptr()}
    big = []

    def pack(t):
        if t.numel() >= 12 * 50 and t.data_ptr() not in inputs:  # a chunk of 2 chains is 300 < 600
            big.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = draft_loss(name, DraftLossInputs(logits, target), chunk_size=2)
    out.loss.backward()
    assert big == []
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        ref_rows("tv" if name == "e2e_tv" else name, logits, target)  # vectorised over chains
    assert big  # the plain reference does save (N, K, V)-size activations: the hook sees them


def test_low_precision_logits_give_a_gradient_of_their_dtype():
    logits, target = random_chains(n=4, k=2, v=32, seed=5, dtype=torch.float32)
    low = logits.detach().to(torch.bfloat16).requires_grad_()
    out = draft_loss("e2e_tv", DraftLossInputs(low, target.to(torch.bfloat16)))
    out.loss.backward()
    assert out.loss.dtype == torch.float32 and low.grad.dtype == torch.bfloat16
    as_float = DraftLossInputs(low.detach().float().requires_grad_(), target.to(torch.bfloat16).float())
    ref = draft_loss("e2e_tv", as_float)
    assert out.loss.item() == pytest.approx(ref.loss.item(), abs=1e-6)


# ---- masks ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_masked_chains_contribute_nothing(name):
    logits, target = random_chains(n=6, k=3, v=8, seed=6)
    mask = torch.tensor([True, False, True, False, True, True])
    out = draft_loss(name, DraftLossInputs(logits, target, mask), chunk_size=4)
    (grad,) = torch.autograd.grad(out.loss, logits)
    assert torch.equal(grad[~mask], torch.zeros_like(grad[~mask]))  # exactly zero
    # garbage (NaN, inf) in masked chains' logits and targets changes nothing, bit for bit
    junk_logits = logits.detach().clone()
    junk_target = target.clone()
    junk_logits[~mask] = float("nan")
    junk_target[1] = float("inf")
    junk_logits.requires_grad_()
    junk = draft_loss(name, DraftLossInputs(junk_logits, junk_target, mask), chunk_size=4)
    (junk_grad,) = torch.autograd.grad(junk.loss, junk_logits)
    assert torch.equal(junk.loss, out.loss) and torch.equal(junk_grad, grad)
    assert torch.equal(junk.tv_per_depth, out.tv_per_depth)
    # dropping the masked chains outright gives the same loss
    kept = draft_loss(name, DraftLossInputs(logits.detach()[mask], target[mask]))
    assert kept.loss.item() == pytest.approx(out.loss.item(), abs=1e-13)


def test_no_kept_chain_gives_zero_loss_that_still_backpropagates():
    logits, target = random_chains(n=3, k=2, v=5, seed=7)
    out = draft_loss("e2e_tv", DraftLossInputs(logits, target, torch.zeros(3, dtype=torch.bool)))
    assert out.loss.item() == 0.0 and out.loss.grad_fn is not None and out.num_chains == 0
    out.loss.backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))
    assert out.tv_per_depth.shape == (2,) and torch.isnan(out.tv_per_depth).all()
    empty = draft_loss("ce", DraftLossInputs(torch.zeros(0, 2, 5, requires_grad=True), torch.zeros(0, 2, 5)))
    assert empty.num_chains == 0 and empty.loss.item() == 0.0


# ---- the target never receives gradient -----------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_target_never_receives_gradient(name):
    logits, target = random_chains(n=4, k=2, v=6, seed=8)
    target_leaf = target.detach().requires_grad_()
    draft_loss(name, DraftLossInputs(logits, target_leaf)).loss.backward()
    assert target_leaf.grad is None and logits.grad is not None
    if name in ROW_FNS:
        flat = target_leaf.reshape(8, 6)
        ROW_FNS[name](logits.reshape(8, 6), flat).sum().backward()
        assert target_leaf.grad is None


def test_rkl_where_target_is_zero_is_finite():
    logits = torch.zeros(1, 3, dtype=torch.float64, requires_grad=True)  # q uniform
    target = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)
    value = rkl_loss(logits, target)
    value.backward()
    assert torch.isfinite(value).all() and torch.isfinite(logits.grad).all()
    assert logits.grad[0, 0] < 0 < logits.grad[0, 1]  # pushes mass back onto the target's token


# ---- bad input ------------------------------------------------------------------------------------

BAD_Z, BAD_P = torch.zeros(4, 2, 5), torch.full((4, 2, 5), 0.2)


@pytest.mark.parametrize("case,message", [
    (lambda: draft_loss("nope", DraftLossInputs(BAD_Z, BAD_P)), "unknown draft loss 'nope'; known: ce, kl, rkl, tv, e2e_tv"),
    (lambda: draft_loss("ce", DraftLossInputs(BAD_Z, BAD_P[:, :1])), r"target_probs shape \(4, 1, 5\) does not match"),
    (lambda: draft_loss("ce", DraftLossInputs(BAD_Z, BAD_P[..., :4])), r"target_probs shape \(4, 2, 4\)"),
    (lambda: draft_loss("ce", DraftLossInputs(BAD_Z, BAD_P[:3])), r"target_probs shape \(3, 2, 5\)"),
    (lambda: draft_loss("ce", DraftLossInputs(BAD_Z[:, 0], BAD_P[:, 0])), r"must be \(N, K, V\), got shape \(4, 5\)"),
    (lambda: draft_loss("ce", DraftLossInputs(BAD_Z[:, :0], BAD_P[:, :0])), "need K >= 1 depths"),
    (lambda: draft_loss("ce", DraftLossInputs(BAD_Z, BAD_P, torch.ones(3, dtype=torch.bool))), r"mask .* got torch.bool \(3,\)"),
    (lambda: draft_loss("ce", DraftLossInputs(BAD_Z, BAD_P, torch.ones(4))), r"mask must be a bool .* got torch.float32 \(4,\)"),
    (lambda: draft_loss("ce", DraftLossInputs(BAD_Z.long(), BAD_P)), "must be floating point, got torch.int64"),
    (lambda: draft_loss("ce", DraftLossInputs(BAD_Z, BAD_P), chunk_size=0), "chunk_size must be a positive int, got 0"),
    (lambda: e2e_tv_loss(BAD_Z, BAD_P[:, :, :3]), r"target_probs shape \(4, 2, 3\)"),
    (lambda: tv_loss(BAD_Z, BAD_P), r"tv_loss: .* must both be \(N, V\)"),  # per-row functions take (N, V)
    (lambda: ce_loss(BAD_Z[:, 0], BAD_P[:3, 0]), r"ce_loss: draft_logits \(4, 5\) and target_probs \(3, 5\)"),
])
def test_bad_input_raises_a_bebop_error_naming_the_problem(case, message):
    with pytest.raises(BebopError, match=message):
        case()


def test_the_loss_names():
    assert list(DRAFT_LOSSES) == NAMES
