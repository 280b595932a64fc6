"""The update a micro-batch at a time: the same optimizer step as one padded forward (gradients
accumulated with each micro-batch's share of the tokens), rows sorted by length and trimmed."""

import random

import pytest
import torch

from bebop.policy import load_policy
from bebop.rl.batch import to_train_batch
from bebop.rl.records import Rollout, RolloutBatch
from bebop.rl.trainer import PolicyTrainer, micro_batch_rows

from rl_helpers import rl_cfg


def long_tail_batch(vocab: int, groups: int = 3, group_size: int = 4, seed: int = 0) -> RolloutBatch:
    """Rollouts of very different lengths (a few long, most short), an environment span in some."""
    rng = random.Random(seed)
    rollouts = []
    for _ in range(groups * group_size):
        n = rng.choice([3, 4, 6, 40])
        mask = [not (5 <= i < 8) for i in range(n)]  # tokens 5..7 came from the environment
        rollouts.append(Rollout([rng.randrange(8, vocab) for _ in range(rng.randint(2, 5))],
                                [rng.randrange(8, vocab) for _ in range(n)],
                                [-rng.uniform(0.5, 3.0) if m else 0.0 for m in mask], mask,
                                float(rng.random() < 0.5), 0))
    return RolloutBatch(rollouts, group_size, 0, 0, 0.0, None, 0.0, 0.0)


def trained(headed, batch, **cfg):
    policy = load_policy(headed, device="cpu")
    trainer = PolicyTrainer(policy, rl_cfg(headed, group_size=4, batch_prompts=3, lr=1e-2, **cfg))
    stats = trainer.step(batch)
    return dict(policy.model.named_parameters()), stats


@pytest.mark.parametrize("update", [{}, {"ppo_epochs": 2, "mini_batches": 2}])
def test_micro_batches_make_the_same_step_as_one_forward(headed, update):
    batch = long_tail_batch(load_policy(headed, device="cpu").codec.vocab_size)
    whole, whole_stats = trained(headed, batch, micro_batch_size=0, **update)
    for size in (1, 5, 8):
        micro, stats = trained(headed, batch, micro_batch_size=size, **update)
        moved = max((whole[n] - load_policy(headed, device="cpu").model.state_dict()[n]).abs().max().item()
                    for n in whole if not n.startswith("mtp."))
        assert moved > 1e-4  # the step did move the weights
        for name, p in whole.items():  # AdamW's first step moves a weight by ~lr = 1e-2: agree to 1e-3 of it
            torch.testing.assert_close(micro[name], p, rtol=1e-4, atol=1e-5)
        for field in ("loss", "pg_loss", "is_weight_mean", "train_entropy", "clip_frac"):
            assert getattr(stats, field) == pytest.approx(getattr(whole_stats, field), rel=1e-4, abs=1e-6), field
        assert stats.optimizer_steps == whole_stats.optimizer_steps


def test_micro_batches_go_by_length_and_drop_padding(headed):
    batch = to_train_batch(long_tail_batch(50), pad_id=0)
    widths = batch.widths
    parts = micro_batch_rows(batch, 5)
    assert [len(p) for p in parts] == [5, 5, 2] and sorted(torch.cat(parts).tolist()) == list(range(12))
    assert all(widths[a].max() <= widths[b].min() for a, b in zip(parts, parts[1:]))  # shortest rows first
    first = batch.rows(parts[0]).trimmed()
    assert first.ids.shape[1] == int(widths[parts[0]].max()) < batch.ids.shape[1]
    assert first.mask.sum() == batch.mask[parts[0]].sum()  # no policy token is cut
    assert [len(p) for p in micro_batch_rows(batch, 0)] == [12] == [len(p) for p in micro_batch_rows(batch, 99)]
