"""The packed training forward: rows that share prompts in one sequence, each prompt once, no padding. Its
logits are each row's own forward's, and the update it gives is the padded update's (float32, to rounding)."""

import random

import pytest
import torch

from bebop.distributed.parallel import Logits
from bebop.errors import BebopError
from bebop.model import load_model
from bebop.model.packing import pack
from bebop.policy import load_policy
from bebop.rl.batch import to_train_batch
from bebop.rl.records import Rollout, RolloutBatch
from bebop.rl.trainer import PolicyTrainer, logprobs_of, micro_batch_rows
from bebop.sampling import SamplingParams
from qwen35_helpers import make_hf_qwen35

from rl_helpers import rl_cfg


def ids(rng: random.Random, n: int, vocab: int) -> torch.Tensor:
    return torch.tensor([rng.randrange(3, vocab) for _ in range(n)], dtype=torch.long)


@pytest.fixture(scope="module")
def dense(hf_model_dir):
    return load_model(hf_model_dir[1]).eval()  # random weights of std 0.3: peaked, position-sensitive logits


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    path = tmp_path_factory.mktemp("hybrid")
    make_hf_qwen35(seed=3).save_pretrained(path)  # Gated DeltaNet and full attention layers, conv kernel 4
    model = load_model(path).eval()
    assert model.config.linear_layers and model.config.attention_layers
    return model


@pytest.fixture(params=["dense", "hybrid"])
def model(request):
    return request.getfixturevalue(request.param)


def test_a_packed_forward_equals_each_rows_own(model):
    rng, vocab = random.Random(0), model.config.vocab_size
    prompts = [ids(rng, n, vocab) for n in (2, 9, 23)]  # 2: shorter than the conv's history
    continuations = [(0, ids(rng, n, vocab)) for n in (0, 4, 70)] + [(1, ids(rng, 7, vocab)) for _ in range(2)]
    continuations.append((2, ids(rng, 12, vocab)))  # 70: more than one chunk of the hybrid's chunked rule
    packing = pack(prompts, continuations)
    assert packing.ids.shape == (1, (2 + 9 + 23) + (4 + 70 + 7 + 7 + 12)) and len(packing.segments) > 1  # sets
    with torch.no_grad():
        packed = Logits(model)(packing.ids, packing)  # (M, V)
        for r, (g, cont) in enumerate(continuations):
            own = Logits(model)(torch.cat([prompts[g], cont])[None])[0]  # (P + C, V)
            torch.testing.assert_close(packed[packing.output_rows == r], own[len(prompts[g]) - 1:],
                                       rtol=1e-4, atol=3e-4)
    assert packing.output_steps.tolist()[:4] == [0, 0, 1, 2]  # row 0: its prompt's last token only


def grouped_rollouts(vocab: int, seed: int = 0) -> RolloutBatch:
    """Three prompts of different lengths, four rollouts each: a long tail of lengths, environment spans."""
    rng, rollouts = random.Random(seed), []
    for _ in range(3):
        prompt = ids(rng, rng.randint(3, 12), vocab).tolist()
        for _ in range(4):
            n = rng.choice([1, 3, 6, 25])
            mask = [not (2 <= i < 4) for i in range(n)]  # tokens 2..3 came from the environment
            rollouts.append(Rollout(prompt, ids(rng, n, vocab).tolist(),
                                    [-rng.uniform(0.5, 3.0) if m else 0.0 for m in mask], mask, float(rng.random() < .5), 0))
    return RolloutBatch(rollouts, 4, 0, 0, 0.0, None, 0.0, 0.0)


@pytest.mark.parametrize("sampling", [SamplingParams(1.0), SamplingParams(0.8, top_k=6)])
def test_packed_logprobs_and_their_gradients_equal_the_padded_ones(model, sampling):
    batch = to_train_batch(grouped_rollouts(model.config.vocab_size), pad_id=0)
    assert batch.prompts.tolist() == [0] * 4 + [4] * 4 + [8] * 4
    results = []
    for packed in (False, True):
        model.zero_grad(set_to_none=True)
        lp, entropy = logprobs_of(model, batch, sampling, entropy_grad=True, packed=packed)
        ((lp * batch.mask).sum() + (entropy * batch.mask).sum()).backward()
        results.append((lp.detach(), entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                                          if p.grad is not None}))
    (lp, entropy, grads), (packed_lp, packed_entropy, packed_grads) = results
    mask = batch.mask
    torch.testing.assert_close(packed_lp[mask], lp[mask], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(packed_entropy[mask], entropy[mask], rtol=1e-4, atol=1e-4)
    assert packed_grads.keys() == grads.keys() and len(grads) > 10
    for name, grad in grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-3, atol=1e-3 * float(grad.abs().max()))


def test_the_packed_update_makes_the_padded_updates_step(headed):
    vocab = load_policy(headed, device="cpu").codec.vocab_size
    steps = []
    for packed in (False, True):
        policy = load_policy(headed, device="cpu")
        trainer = PolicyTrainer(policy, rl_cfg(headed, group_size=4, batch_prompts=3, lr=1e-2, micro_batch_size=5),
                                packed=packed)
        stats = trainer.step(grouped_rollouts(vocab, seed=1))
        steps.append((dict(policy.model.named_parameters()), stats))
    (padded, padded_stats), (packed_, packed_stats) = steps
    for name, p in padded.items():
        torch.testing.assert_close(packed_[name], p, rtol=1e-4, atol=1e-5)
    assert packed_stats.loss == pytest.approx(padded_stats.loss, rel=1e-4, abs=1e-6)
    assert packed_stats.train_entropy == pytest.approx(padded_stats.train_entropy, rel=1e-4)


def test_a_packed_update_takes_a_prompts_rows_together():
    batch = to_train_batch(grouped_rollouts(50, seed=1), pad_id=0)
    parts = micro_batch_rows(batch, 4, by_prompt=True)
    assert [sorted(batch.prompts[p].tolist()) for p in parts] == [[0] * 4, [4] * 4, [8] * 4]
    assert all(bool((batch.widths[p].diff() >= 0).all()) for p in parts)  # by width within a prompt
    padded = micro_batch_rows(batch, 4)  # by width over the batch: prompts mixed
    assert any(len(set(batch.prompts[p].tolist())) > 1 for p in padded)


def test_a_packed_forward_refuses_what_it_cannot_run(dense):
    packing = pack([torch.tensor([3, 4, 5])], [(0, torch.tensor([6, 7]))])
    with pytest.raises(BebopError, match="without a cache"):
        dense(packing.ids, dense.new_cache(1, 16), packing=packing)
    with pytest.raises(BebopError, match="not the packing's"):
        dense(packing.ids[:, :3], packing=packing)
    with pytest.raises(BebopError, match="names prompt 1"):
        pack([torch.tensor([3])], [(1, torch.tensor([4]))])
    with pytest.raises(BebopError, match="non-empty"):
        pack([torch.tensor([], dtype=torch.long)], [(0, torch.tensor([4]))])


def test_under_bfloat16_mixed_precision_packing_moves_log_probs_no_more_than_bfloat16_does(dense):
    batch = to_train_batch(grouped_rollouts(dense.config.vocab_size), pad_id=0)
    with torch.no_grad():
        exact, _ = logprobs_of(dense, batch, SamplingParams(1.0), packed=False)  # float32
        padded, _ = logprobs_of(dense, batch, SamplingParams(1.0), dtype="bfloat16", packed=False)
        packed, _ = logprobs_of(dense, batch, SamplingParams(1.0), dtype="bfloat16")
    mask = batch.mask
    rounding = float((padded - exact)[mask].abs().max())  # what bfloat16 matmuls move a log-prob by here
    assert 0 < rounding and float((packed - padded)[mask].abs().max()) <= 2 * rounding
    assert float((packed - exact)[mask].abs().max()) <= 2 * rounding
