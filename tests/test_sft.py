"""Policy SFT on task demonstrations, and `bebop eval`."""

import json

import pytest
import torch

from bebop.cli import main
from bebop.encoding import IGNORE, encode_example
from bebop.errors import BebopError
from bebop.model import load_model
from bebop.sft import SFTConfig, train_sft

from conftest import CHAR_CODEC

TINY = (("hidden_size", 32), ("intermediate_size", 64), ("num_hidden_layers", 1), ("num_attention_heads", 2),
        ("num_key_value_heads", 1), ("head_dim", 16), ("max_position_embeddings", 256))


def _cfg(**kw):
    base = dict(task="math", steps=30, batch_size=8, lr=5e-3, warmup=5, pool=200, save_every=15, model_overrides=TINY)
    base.update(kw)
    return SFTConfig(**base)


def test_labels_cover_the_completion_and_eos_only():
    ids, labels = encode_example(CHAR_CODEC, "Q: 1+1?\n", "2 <call>calc 1+1</call><obs>2</obs> ok")
    text_ids = CHAR_CODEC.encode("Q: 1+1?\n")
    assert all(x == IGNORE for x in labels[: len(text_ids)])  # prompt
    assert labels[-1] == CHAR_CODEC.eos_id
    obs = CHAR_CODEC.encode("<obs>2</obs>")
    start = ids.index(obs[0])
    assert labels[start: start + len(obs)] == [IGNORE] * len(obs)  # environment tokens
    assert labels[start - 1] == CHAR_CODEC.token_id("</call>")  # the policy's own tool call is trained


def test_sft_lowers_the_loss_and_writes_a_loadable_model(tmp_path, capsys):
    out = tmp_path / "policy"
    metrics = train_sft(out, _cfg(), progress=False)
    state = torch.load(out / "train_state.pt", weights_only=False)
    assert state["step"] == 30
    history = state["history"]
    assert sum(history[-5:]) / 5 < 0.7 * sum(history[:5]) / 5
    assert metrics["num_parameters"] == sum(p.numel() for p in load_model(out).parameters())
    assert json.loads((out / "sft_meta.json").read_text())["final_loss"] == metrics["final_loss"]
    logged = [json.loads(line) for line in (out / "sft_metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in logged] == list(range(1, 31)) and [row["loss"] for row in logged] == history
    assert main(["generate", "--model", str(out), "--prompt", "Ann has 3 eggs.", "--max-new-tokens", "5"]) == 0
    assert main(["eval", "--model", str(out), "--task", "math", "--n", "4", "--max-new-tokens", "40"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"pass_rate", "mean_entropy", "n"} <= set(row) and row["n"] == 4
    assert 0.0 <= row["pass_rate"] <= 1.0 and row["mean_entropy"] > 0


def test_resume_continues_and_matches_an_uninterrupted_run(tmp_path, monkeypatch):
    import bebop.sft as sft

    full = tmp_path / "full"
    train_sft(full, _cfg(steps=30), progress=False)
    real, calls = sft.sample_batch, []

    def crash_on_step_21(*args, **kwargs):  # the run dies after its step-15 save, mid-way to 30
        calls.append(1)
        if len(calls) == 21:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    part = tmp_path / "part"
    monkeypatch.setattr(sft, "sample_batch", crash_on_step_21)
    with pytest.raises(KeyboardInterrupt):
        train_sft(part, _cfg(steps=30), progress=False)
    assert torch.load(part / "train_state.pt", weights_only=False)["step"] == 15
    monkeypatch.setattr(sft, "sample_batch", real)
    train_sft(part, _cfg(steps=30), resume=True, progress=False)
    a = torch.load(full / "train_state.pt", weights_only=False)["history"]
    b = torch.load(part / "train_state.pt", weights_only=False)["history"]
    assert len(b) == 30 and b == pytest.approx(a, rel=1e-3)


def test_existing_out_and_bad_resume(tmp_path):
    out = tmp_path / "p"
    train_sft(out, _cfg(steps=2, save_every=2), progress=False)
    with pytest.raises(BebopError, match="--resume"):
        train_sft(out, _cfg(steps=2), progress=False)
    with pytest.raises(BebopError, match="lr"):
        train_sft(out, _cfg(steps=2, lr=1.0), resume=True, progress=False)
    with pytest.raises(BebopError, match="unknown task"):
        train_sft(tmp_path / "q", _cfg(task="poetry"), progress=False)


def test_length_sorted_chunks_give_the_padded_batch_gradient(tmp_path):
    """backward_step_loss over micro-batches == the mean loss and gradient of one padded batch."""
    import random

    import torch.nn.functional as F

    from bebop.embedded import init_model_dir
    from bebop.policy import load_policy
    from bebop.sft import backward_step_loss, collate, held_out_loss, sample_batch
    from bebop.tasks import get_task

    init_model_dir(tmp_path / "m", seed=0, **dict(TINY))
    policy = load_policy(tmp_path / "m", device="cpu")
    task = get_task("math")
    chunks = sample_batch(task, task.problems("train", 50, 0), random.Random(0), policy.codec, 10, policy.pad_id, 256,
                          micro=3)
    assert [len(ids) for ids, _ in chunks] == [3, 3, 3, 1]
    widths = [ids.shape[1] for ids, _ in chunks]
    assert widths == sorted(widths) and max(widths) <= 256
    mean = backward_step_loss(policy, chunks)
    assert held_out_loss(policy, chunks, "float32") == pytest.approx(mean, rel=1e-6)  # the same mean, no gradient
    grads = [p.grad.clone() for p in policy.model.parameters()]
    policy.model.zero_grad(set_to_none=True)
    examples = [(ids[b][ids[b] != policy.pad_id].tolist(), labels[b][: int((ids[b] != policy.pad_id).sum())].tolist())
                for ids, labels in chunks for b in range(len(ids))]
    ids, labels = collate(examples, policy.pad_id)
    logits = policy.model.logits(policy.model(ids))
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=IGNORE)
    loss.backward()
    assert mean == pytest.approx(loss.item(), rel=1e-5)
    for g, p in zip(grads, policy.model.parameters()):
        assert torch.allclose(g, p.grad, atol=1e-6, rtol=1e-4)


def test_a_run_saved_before_a_field_existed_resumes(tmp_path):
    """A train state written before --data / --model / --dtype existed resumes: the missing fields take
    their defaults, which is what the run did."""
    out = tmp_path / "policy"
    train_sft(out, _cfg(steps=2, save_every=1), progress=False)
    state = torch.load(out / "train_state.pt", weights_only=False)
    for field in ("data", "model", "dtype"):
        del state["config"][field]
    torch.save(state, out / "train_state.pt")
    with pytest.raises(BebopError, match="config differs in steps"):
        train_sft(out, _cfg(steps=3, save_every=1), resume=True, progress=False)
    assert train_sft(out, _cfg(steps=2, save_every=1), resume=True, progress=False)["steps"] == 2
