"""MTP training: trunk untouched, acceptance rises, resume, bad input."""

import json

import pytest
import torch

from bebop.errors import BebopError
from bebop.model import load_model
from bebop.mtp.data import Sequence
from bebop.mtp.train import train_mtp
from bebop.mtp.train_config import MTPTrainConfig
from bebop.mtp.train_step import make_batch
from bebop.policy import load_policy


def _cfg(**kw):
    base = dict(loss="e2e_tv", depths=3, steps=40, lr=3e-3, batch_size=8, num_samples=24, max_new_tokens=24,
                save_every=20, temperature=1.0)
    base.update(kw)
    return MTPTrainConfig(**base)


def test_training_changes_only_the_head_and_raises_acceptance(headed_model, tmp_path):
    before = load_model(headed_model)
    out = tmp_path / "trained"
    result = train_mtp(headed_model, _cfg(), out=out, progress=False)
    after = load_model(out)
    for name, tensor in before.state_dict().items():
        same = torch.equal(tensor, after.state_dict()[name])
        assert same != name.startswith("mtp."), name  # trunk, embedding and LM head equal; head changed
    lines = [json.loads(x) for x in (out / "mtp_metrics.jsonl").read_text().splitlines()]
    first, last = lines[0]["acceptance_per_depth"][0], result["acceptance_per_depth"][0]
    assert last > first + 0.1, (first, last)


def test_measured_acceptance_rises_in_the_engine(headed_model, tmp_path):
    from bebop.mtp.evaluate import evaluate_mtp
    from bebop.tasks import get_task

    def acceptance(path):
        policy = load_policy(path)
        rows = evaluate_mtp(policy, get_task("math"), k=2, temperatures=[1.0], modes=["rs"], n=12,
                            max_new_tokens=24, progress=False)
        return rows[0]["acceptance_rate"]

    untrained = acceptance(headed_model)
    train_mtp(headed_model, _cfg(steps=60), out=tmp_path / "t", progress=False)
    assert acceptance(tmp_path / "t") > untrained + 0.1


def test_resume_continues_from_the_saved_step(headed_model, tmp_path):
    full = train_mtp(headed_model, _cfg(steps=40), out=tmp_path / "full", progress=False)  # saves at 20 and 40
    state = torch.load(tmp_path / "full" / "mtp_train_state.pt", weights_only=False)
    assert state["step"] == 40
    # simulate a run killed after step 20: rewind to the step-20 checkpoint, then resume
    partial = tmp_path / "partial"
    train_mtp(headed_model, _cfg(steps=20, save_every=20), out=partial, progress=False)
    st = torch.load(partial / "mtp_train_state.pt", weights_only=False)
    st["config"]["steps"] = 40
    del st["config"]["dtype"], st["config"]["data"]  # a state written before these fields resumes (float32, no file)
    torch.save(st, partial / "mtp_train_state.pt")
    resumed = train_mtp(headed_model, _cfg(steps=40), out=partial, resume=True, progress=False)
    lines = (partial / "mtp_metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == list(range(1, 41))
    assert resumed["loss"] == pytest.approx(full["loss"], rel=1e-4)
    with pytest.raises(BebopError, match="config differs in loss$"):  # the fields are named
        train_mtp(headed_model, _cfg(steps=40, loss="ce"), out=partial, resume=True, progress=False)


def test_chain_mask_excludes_prompt_padding_and_observations():
    seqs = [Sequence([1, 2, 3], [4, 5, 6, 7, 8], [False, False, True, False, False]),
            Sequence([1, 2], [4, 5, 6], [False, False, False])]
    batch = make_batch(seqs, depths=2, pad_id=0)
    # row 0: completion tokens at positions 3..7, an env token at 5. Chain t feeds x_{t+1}..x_{t+D}
    # as teacher-forced inputs, so those must be policy tokens: t = 2 (3, 4) and t = 5 (6, 7).
    assert batch.keep[0].tolist() == [False, False, True, False, False, True, False, False]
    assert batch.keep[1].tolist() == [False, True, True, False, False, False, False, False]


@pytest.mark.parametrize("kw,needle", [(dict(loss="l2"), "unknown loss"), (dict(depths=0), "depths"),
                                       (dict(dtype="float16"), "unknown training dtype 'float16'; choose from float32, "
                                                               "bfloat16")])
def test_bad_config(headed_model, kw, needle):
    with pytest.raises(BebopError, match=needle):
        train_mtp(headed_model, _cfg(**kw), progress=False)


def test_bfloat16_trains_resumes_and_keeps_float32_masters(headed_model, tmp_path):
    """bf16 mixed precision: the loss falls and acceptance rises; the saved model keeps its declared
    dtype (float32 here) and AdamW its float32 state; a resumed run equals a straight one."""
    out = tmp_path / "bf16"
    result = train_mtp(headed_model, _cfg(dtype="bfloat16", steps=30, save_every=15), out=out, progress=False,
                       device="cpu")
    lines = [json.loads(x) for x in (out / "mtp_metrics.jsonl").read_text().splitlines()]
    assert result["loss"] < lines[0]["loss"] - 0.2, (lines[0]["loss"], result["loss"])
    assert result["acceptance_per_depth"][0] > lines[0]["acceptance_per_depth"][0] + 0.1
    state = torch.load(out / "mtp_train_state.pt", weights_only=False)
    assert state["config"]["dtype"] == "bfloat16"
    moments = [t for s in state["optimizer"]["state"].values() for t in s.values() if t.dim() > 0]
    assert moments and all(t.dtype == torch.float32 for t in moments)
    assert load_model(out).dtype == load_model(headed_model).dtype == torch.float32
    first = {}  # one ce step each way: close, but not equal (the bf16 products ran)
    for dtype in ("float32", "bfloat16"):
        train_mtp(headed_model, _cfg(loss="ce", steps=1, dtype=dtype), out=tmp_path / dtype, progress=False)
        first[dtype] = json.loads((tmp_path / dtype / "mtp_metrics.jsonl").read_text())["loss"]
    assert first["float32"] != first["bfloat16"] and first["float32"] == pytest.approx(first["bfloat16"], rel=0.01)
    partial = tmp_path / "partial"
    train_mtp(headed_model, _cfg(dtype="bfloat16", steps=15, save_every=15), out=partial, progress=False)
    st = torch.load(partial / "mtp_train_state.pt", weights_only=False)
    st["config"]["steps"] = 30
    torch.save(st, partial / "mtp_train_state.pt")
    resumed = train_mtp(headed_model, _cfg(dtype="bfloat16", steps=30, save_every=15), out=partial, resume=True,
                        progress=False)
    assert resumed["loss"] == pytest.approx(result["loss"], rel=1e-4)
    with pytest.raises(BebopError, match="config differs in dtype$"):  # the precision is part of the run
        train_mtp(headed_model, _cfg(steps=30, save_every=15), out=partial, resume=True, progress=False)


@pytest.mark.parametrize("device,needle", [("tpu", "unknown device 'tpu'; use auto, cpu, cuda or cuda:N"),
                                           ("cuda:0", "CUDA is not available")])
def test_bad_device(headed_model, device, needle):
    if device.startswith("cuda") and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(BebopError, match=needle):
        train_mtp(headed_model, _cfg(steps=1), progress=False, device=device)


def test_train_cli_takes_dtype_and_device(headed_model, tmp_path, capsys):
    from bebop.cli import main

    out = tmp_path / "cli"
    assert main(["mtp", "train", "--model", str(headed_model), "--out", str(out), "--steps", "2", "--depths", "2",
                 "--batch-size", "4", "--num-samples", "8", "--max-new-tokens", "12", "--dtype", "bfloat16",
                 "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["steps"] == 2
    assert torch.load(out / "mtp_train_state.pt", weights_only=False)["config"]["dtype"] == "bfloat16"


def test_model_without_head(tiny_model_dir):
    with pytest.raises(BebopError, match="bebop mtp init"):
        train_mtp(tiny_model_dir, _cfg(), progress=False)


def test_data_from_another_tokenizer(headed_model, tmp_path):
    cache = tmp_path / "cache"
    train_mtp(headed_model, _cfg(steps=1), out=tmp_path / "a", progress=False, data_cache=cache)
    (path,) = cache.glob("*.jsonl")
    path.write_text(path.read_text().replace('"tokenizer": "', '"tokenizer": "x'))
    with pytest.raises(BebopError, match="another tokenizer"):
        train_mtp(headed_model, _cfg(steps=1), out=tmp_path / "b", progress=False, data_cache=cache)


def test_mtp_eval_cli_prints_one_row_per_point(headed_model, capsys):
    from bebop.cli import main

    assert main(["mtp", "eval", "--model", str(headed_model), "--k", "2", "--temperatures", "0.5,1.0",
                 "--mode", "both", "--n", "3", "--max-new-tokens", "12"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(r["mode"], r["temperature"]) for r in rows] == [("rs", 0.5), ("rs", 1.0), ("to", 0.5), ("to", 1.0)]
    for r in rows:
        assert {"acceptance_rate", "mean_acceptance_length", "acceptance_rate_per_position", "mean_entropy"} <= set(r)
        assert len(r["acceptance_rate_per_position"]) == 2


def test_ce_warmup_switches_loss_once():
    from bebop.mtp.train_step import loss_at

    cfg = _cfg(loss="e2e_tv", steps=10, ce_warmup_steps=4)
    assert [loss_at(s, cfg) for s in range(10)] == ["ce"] * 4 + ["e2e_tv"] * 6
    with pytest.raises(BebopError, match="ce-warmup"):
        _cfg(steps=10, ce_warmup_steps=10).validate()


def test_a_bad_dtype_fails_when_the_config_is_made():
    with pytest.raises(BebopError, match="unknown training dtype 'float16'"):
        MTPTrainConfig(dtype="float16")


def test_training_on_given_rollouts_equals_self_distillation_on_the_same_tokens(headed_model, tmp_path):
    """`--rollouts FILE`: the same token ids give the same head as the self-distillation path that sampled them
    (here the file is that path's own sample cache, read as any engine's dump: prompt_ids + completion_ids)."""
    sampled = tmp_path / "sampled"
    train_mtp(headed_model, _cfg(steps=6), out=sampled, progress=False, data_cache=tmp_path / "cache")
    (cache,) = (tmp_path / "cache").glob("*.jsonl")
    given = tmp_path / "given"
    train_mtp(headed_model, _cfg(steps=6, rollouts=str(cache)), out=given, progress=False,
              data_cache=tmp_path / "unused")
    assert not (tmp_path / "unused").exists()  # nothing sampled
    a, b = load_model(sampled).state_dict(), load_model(given).state_dict()
    assert all(torch.equal(a[name], b[name]) for name in a)
