"""Your own model and data end to end (issue 16): `bebop rl --data` with a custom reward and held-out
evaluation, `bebop sft --data --model`, `bebop eval --data`, bfloat16 training; bad input is one line,
exit code 2 and nothing written to the run directory."""

import json
import shutil

import pytest
import torch

from bebop.cli import main
from bebop.model import load_model
from bebop.model.checkpoint import release_dtype
from bebop.sft import SFTConfig, train_sft
from data_helpers import PREAMBLE, user, verl_row, with_chat_template, write_rows

from rl_helpers import read_metrics

REWARD = """
def two_digits(data_source, solution_str, ground_truth, extra_info):
    return float(sum(ch.isdigit() for ch in solution_str) >= 2)
"""


@pytest.fixture(scope="module")
def own(headed, tmp_path_factory):
    """A headed chat model, a verl parquet file, a TRL eval file and a reward file."""
    pytest.importorskip("pyarrow")
    root = tmp_path_factory.mktemp("own")
    (root / "reward.py").write_text(REWARD)
    return {"model": with_chat_template(headed, root / "model"), "reward": f"{root / 'reward.py'}:two_digits",
            "train": write_rows(root / "train.parquet", [verl_row(f"{i}+{i}?", str(2 * i), source="mine")
                                                         for i in range(5)]),
            "eval": write_rows(root / "eval.jsonl", [{"prompt": user(f"{i}*2?"), "solution": str(2 * i)}
                                                     for i in range(3)])}


def rl_args(own, out, *extra):
    return ["rl", "--out", str(out), "--model", str(own["model"]), "--data", str(own["train"]), "--reward",
            own["reward"], "--steps", "2", "--group-size", "2", "--batch-prompts", "2", "--max-new-tokens", "8",
            "--no-progress", "--device", "cpu", *extra]


def test_rl_on_your_own_data_with_speculative_rollouts(own, tmp_path, capsys, monkeypatch):
    import bebop.rl.evaluation as evaluation

    engines, real = [], evaluation.run_episodes
    monkeypatch.setattr(evaluation, "run_episodes", lambda *a, **kw: engines.append(kw["generate_fn"]) or real(*a, **kw))
    run = tmp_path / "run"
    assert main(rl_args(own, run, "--spec", "rs", "--k", "2", "--eval-data", str(own["eval"]), "--eval-every",
                        "1", "--dtype", "bfloat16")) == 0
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(0.0 <= m["eval_reward"] <= 1.0 and m["eval_pass_rate"] is not None for m in metrics)
    assert len(engines) == 2 and all(fn.__qualname__.startswith("speculative_rollout_fn") for fn in engines)
    dumped = [json.loads(line) for line in (run / "rollouts" / "step-000001.jsonl").read_text().splitlines()]
    assert all(r["prompt"].startswith(PREAMBLE + "<|im_start|>user\n") for r in dumped)
    assert all(r["prompt"].endswith("+" + r["prompt"].split("+")[1].split("?")[0] + "?<|im_end|>\n"
                                    "<|im_start|>assistant\n") for r in dumped)
    assert json.loads((run / "config.json").read_text())["data"] == str(own["train"])
    assert (run / "model" / "tokenizer_config.json").read_text() == (own["model"] / "tokenizer_config.json").read_text()


def test_eval_on_your_own_data(own, capsys):
    assert main(["eval", "--model", str(own["model"]), "--data", str(own["eval"]), "--reward", own["reward"],
                 "--max-new-tokens", "8", "--device", "cpu"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (row["task"], row["n"]) == ("eval.jsonl", 3)


@pytest.mark.parametrize("flag", ["--batch-size", "--max-new-tokens"])
def test_eval_refuses_a_zero_batch_or_length(own, capsys, flag):
    assert main(["eval", "--model", str(own["model"]), "--data", str(own["eval"]), "--reward", own["reward"],
                 flag, "0", "--device", "cpu"]) == 2
    assert f"{flag} must be >= 1, got 0" in capsys.readouterr().err


def bad_inputs(own, tmp_path):
    empty, csv, no_prompt, bad_chat = (tmp_path / name for name in ("empty.jsonl", "d.csv", "np.jsonl", "bc.jsonl"))
    empty.write_text("")
    csv.write_text("prompt\n")
    no_prompt.write_text('{"prompt": "1?", "answer": 1}\n{"question": "2?"}\n')
    bad_chat.write_text(json.dumps({"prompt": [{"role": "tool", "content": "x"}], "answer": 1}) + "\n")
    unknown = write_rows(tmp_path / "u.jsonl", [verl_row("1?", "1", source="somewhere")])
    return [
        (["--data", str(tmp_path / "missing.jsonl")], "dataset file not found"),
        (["--data", str(empty)], "empty.jsonl: the dataset has no rows"),
        (["--data", str(csv)], "unknown dataset format '.csv'"),
        (["--data", str(no_prompt)], "np.jsonl: row 2 has no 'prompt' (nor 'messages') key"),
        (["--data", str(bad_chat)], "failed to render " + str(bad_chat) + ": row 1 prompt: unknown role tool"),
        (["--reward", "nowhere.py:fn"], "--reward nowhere.py:fn: file not found"),
        (["--reward", "math"], "has no ground truth the math reward can check"),  # 'mine' rows: fine; these...
        (["--data", str(unknown), "--reward", ""], "u.jsonl: row 1 has 'somewhere', which no built-in scorer knows"),
        (["--eval-data", str(empty)], "empty.jsonl: the dataset has no rows"),
    ]


def test_bad_input_is_one_line_exit_2_and_nothing_written(own, tmp_path, capsys):
    cases = bad_inputs(own, tmp_path)
    own_math = {**own, "train": write_rows(tmp_path / "gt.jsonl", [{"prompt": "1?", "data_source": "openai/gsm8k"}])}
    for i, (extra, message) in enumerate(cases):
        run = tmp_path / f"run{i}"
        base = rl_args(own_math if extra == ["--reward", "math"] else own, run)
        assert main(base + extra) == 2, extra
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (extra, err)
        assert not run.exists(), extra


def test_sft_on_your_own_data_from_a_model_directory(own, tmp_path, capsys):
    source = own["model"]
    data = write_rows(tmp_path / "sft.jsonl", [{"prompt": user(f"{i}+1?"), "completion": str(i + 1)}
                                               for i in range(6)])
    out = tmp_path / "sft"
    held_out = write_rows(tmp_path / "held.jsonl", [{"prompt": user("9+1?"), "completion": "10"}])
    args = ["sft", "--out", str(out), "--model", str(source), "--data", str(data), "--steps", "4", "--batch-size",
            "4", "--lr", "1e-3", "--warmup", "1", "--save-every", "2", "--device", "cpu", "--dtype", "bfloat16",
            "--eval-data", str(held_out), "--eval-every", "2"]
    assert main(args) == 0
    logged = [json.loads(line) for line in (out / "sft_metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in logged] == [1, 2, 3, 4] and all(row["loss"] > 0 for row in logged)
    assert ["eval_loss" in row for row in logged] == [False, True, False, True] and logged[1]["eval_loss"] > 0
    trained, start = load_model(out).state_dict(), load_model(source).state_dict()
    assert any(not torch.equal(trained[name], start[name]) for name in start if not name.startswith("mtp."))
    assert all(torch.equal(trained[name], start[name]) for name in start if name.startswith("mtp."))  # head kept
    assert (out / "tokenizer_config.json").read_text() == (source / "tokenizer_config.json").read_text()
    assert main(["sft", "--out", str(tmp_path / "x"), "--model", str(source), "--data", str(tmp_path / "no.jsonl")]) == 2
    assert "dataset file not found" in capsys.readouterr().err and not (tmp_path / "x").exists()
    assert main(["sft", "--out", str(tmp_path / "x"), "--model", str(source), "--data", str(data), "--eval-data",
                 str(data.with_suffix(".csv"))]) == 2
    assert "unknown dataset format '.csv'" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_a_saved_model_keeps_its_dtype_and_resume_keeps_float32_masters(own, tmp_path, monkeypatch):
    """A bfloat16-declared model trains on float32 masters, is saved in bfloat16, and resumes exactly."""
    import bebop.sft as sft

    source = shutil.copytree(own["model"], tmp_path / "bf16")
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "torch_dtype": "bfloat16"}))
    data = write_rows(tmp_path / "sft.jsonl", [{"prompt": user(f"{i}+1?"), "completion": str(i + 1)} for i in range(4)])
    cfg = SFTConfig(model=str(source), data=str(data), steps=4, batch_size=2, lr=1e-2, warmup=1, save_every=2)
    train_sft(tmp_path / "full", cfg, progress=False)
    assert release_dtype(load_model(tmp_path / "full")) == torch.bfloat16
    assert json.loads((tmp_path / "full" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    real, calls = sft.sample_batch, []

    def crash_on_step_3(*args, **kwargs):  # dies after the step-2 save
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(sft, "sample_batch", crash_on_step_3)
    with pytest.raises(KeyboardInterrupt):
        train_sft(tmp_path / "part", cfg, progress=False)
    monkeypatch.setattr(sft, "sample_batch", real)
    train_sft(tmp_path / "part", cfg, resume=True, progress=False)
    history = [torch.load(tmp_path / run / "train_state.pt", weights_only=False)["history"] for run in ("full", "part")]
    assert history[0] == history[1]  # exact: the float32 masters, not the bfloat16 directory, were resumed


def test_a_failing_reward_scores_zero_and_is_counted_never_a_crash(own, tmp_path, capsys):
    broken = tmp_path / "broken.py"
    broken.write_text("def score(data_source, solution_str, ground_truth, extra_info):\n    return float('nan')\n")
    run = tmp_path / "run"
    args = rl_args(own, run, "--steps", "1")
    args[args.index("--reward") + 1] = f"{broken}:score"
    assert main(args) == 0
    [metrics] = read_metrics(run)
    assert (metrics["reward"], metrics["reward_errors"]) == (0.0, 4)  # 2 prompts x 2 samples
    err = capsys.readouterr().err
    assert err.count("bebop: reward error at") == 4 and "row " in err and "ValueError: the reward returned nan" in err
