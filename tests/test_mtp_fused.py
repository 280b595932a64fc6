"""MTP training through the fused loss (issue 16, part 5): chain_step, which never makes a (B, T, V)
tensor, equals the full-distribution loss the trainer used before (written out from model.logits
and model.mtp_logits), in value, metrics and the head's gradient, on a model with its
LM head tied to the embedding and on one without. The reference is benchmarks/mtp_memory.py's
`full` arm, so this also checks that the benchmark compares like with like."""

import sys
from pathlib import Path

import pytest
import torch

from bebop.model import load_model
from bebop.mtp.chain import shifted
from bebop.mtp.data import Sequence
from bebop.mtp.train_config import MTPTrainConfig
from bebop.mtp.train_step import chain_distributions, chain_step, freeze_trunk, make_batch
from bebop.policy import Policy

from conftest import CHAR_CODEC

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from mtp_memory import full_distribution_loss  # noqa: E402  the pre-fusion trainer, also the benchmark's `full` arm


def _policy_and_batch(path, seed=0):
    model = load_model(path)
    model.attach_mtp(1, torch.Generator().manual_seed(seed))
    policy = Policy(model, CHAR_CODEC)
    g = torch.Generator().manual_seed(seed + 1)
    seqs = [Sequence(torch.randint(5, 90, (3,), generator=g).tolist(), torch.randint(5, 90, (n,), generator=g).tolist(),
                     [i == 4 for i in range(n)]) for n in (14, 20, 9)]  # one env token per completion
    return policy, make_batch(seqs, 3, policy.pad_id)


@pytest.mark.parametrize("which", ["untied", "tied"])
@pytest.mark.parametrize("name", ["ce", "rkl", "e2e_tv"])
def test_chain_step_equals_the_full_distribution_loss(hf_model_dir, tiny_model_dir, which, name):
    policy, batch = _policy_and_batch(hf_model_dir[1] if which == "untied" else tiny_model_dir)
    assert policy.model.config.tie_word_embeddings == (which == "tied")
    params = freeze_trunk(policy)
    cfg = MTPTrainConfig(loss=name, depths=3, temperature=0.8)
    got = chain_step(policy, batch, cfg)
    want = full_distribution_loss(policy, batch, cfg, name)
    assert got.num_chains == want.num_chains > 20
    assert got.loss.item() == pytest.approx(want.loss.item(), rel=1e-5, abs=1e-7)
    torch.testing.assert_close(got.acceptance_per_depth, want.acceptance_per_depth, rtol=1e-5, atol=1e-6)
    g_got = torch.autograd.grad(got.loss, params)
    g_want = torch.autograd.grad(want.loss, params)
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert policy.model.lm_head.weight.grad is None  # the shared LM head stays frozen


def test_chain_distributions_are_the_same_full_distributions(hf_model_dir):
    policy, batch = _policy_and_batch(hf_model_dir[1], seed=2)
    with torch.no_grad():
        inputs = chain_distributions(policy, batch, 3, 0.8)
        model = policy.model
        hidden = model(batch.ids)
        target = torch.softmax(model.logits(hidden) / 0.8, dim=-1)  # (B, T, V)
    keep = batch.keep.reshape(-1)
    v = target.shape[-1]
    for d in (1, 2, 3):  # the target of depth d at chain t is the trunk's distribution at t + d
        want = shifted(target, d, 0).reshape(-1, v)[keep]
        torch.testing.assert_close(inputs.target_probs[:, d - 1][keep], want, rtol=1e-5, atol=1e-7)
    assert inputs.draft_logits.shape == inputs.target_probs.shape == (keep.numel(), 3, v)
