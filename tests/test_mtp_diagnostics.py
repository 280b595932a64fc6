"""Draft-vs-target diagnostics (the paper's Fig. 11): the split of acceptance mass adds up to 1 - TV,
KL and the entropy gap vanish when the head equals the target, and the chain diagnostics agree with
the draft loss module's own per-depth acceptance on the same chains."""

import pytest
import torch

from bebop.errors import BebopError
from bebop.losses import draft_loss
from bebop.model import load_model
from bebop.mtp.data import Sequence
from bebop.mtp.diagnostics import draft_diagnostics
from bebop.mtp.draft_stats import row_diagnostics
from bebop.mtp.train_step import chain_distributions, make_batch
from bebop.policy import Policy

from conftest import CHAR_CODEC


def test_the_acceptance_split_adds_up_and_a_perfect_head_has_no_gap():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(50, 3, 12, generator=g) * 2
    p = torch.softmax(torch.randn(50, 3, 12, generator=g) * 2, -1)
    diag = row_diagnostics(logits, p)  # (N, D, 5)
    tv = 0.5 * (torch.softmax(logits, -1) - p).abs().sum(-1)
    torch.testing.assert_close(diag[..., 2], 1 - tv)  # alpha = sum min(p, q) = 1 - TV
    torch.testing.assert_close(diag[..., 3] + diag[..., 4], diag[..., 2])
    assert (diag[..., 0] >= -1e-6).all()  # KL >= 0
    same = row_diagnostics(torch.log(p), p)
    torch.testing.assert_close(same[..., 0], torch.zeros(50, 3), atol=1e-5, rtol=0)
    torch.testing.assert_close(same[..., 1], torch.zeros(50, 3), atol=1e-5, rtol=0)
    torch.testing.assert_close(same[..., 2], torch.ones(50, 3), atol=1e-5, rtol=0)


def test_chain_diagnostics_match_the_loss_modules_acceptance(hf_model_dir):
    _, path = hf_model_dir
    model = load_model(path)
    model.attach_mtp(1, torch.Generator().manual_seed(0))
    policy = Policy(model, CHAR_CODEC)
    g = torch.Generator().manual_seed(1)
    seqs = [Sequence(torch.randint(5, 90, (4,), generator=g).tolist(), torch.randint(5, 90, (n,), generator=g).tolist(),
                     [False] * n) for n in (12, 20, 9)]
    rows = draft_diagnostics(policy, seqs, depths=3, temperature=0.8, batch_size=2)
    with torch.no_grad():
        out = draft_loss("tv", chain_distributions(policy, make_batch(seqs, 3, policy.pad_id), 3, 0.8))
    assert rows[0]["chains"] == out.num_chains == sum(n - 3 + 1 for n in (12, 20, 9))  # starts: last prompt token on
    for row, acc in zip(rows, out.acceptance_per_depth.tolist()):
        assert row["alpha"] == pytest.approx(acc, abs=1e-5)
        assert row["alpha_p_gt_q"] + row["alpha_q_gt_p"] == pytest.approx(row["alpha"], abs=1e-6)
    with pytest.raises(BebopError, match="at least one sequence"):
        draft_diagnostics(policy, [], depths=3, temperature=1.0)
    with pytest.raises(BebopError, match="no chain of 3 policy tokens"):
        draft_diagnostics(policy, [Sequence([5, 6], [7, 8], [False, False])], depths=3, temperature=1.0)
