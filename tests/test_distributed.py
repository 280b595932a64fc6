"""The learner over 2 ranks (torch.distributed, gloo on this CPU): sft, mtp train and 3 RL steps give one
process's weights; a run saved with 2 ranks resumes with 2 (bit-exact) or 1; a rank that dies stops the run with
a line naming it and leaves the last save intact; bad input is refused before any rank starts.

Tolerance: the ranks sum their gradients in another order than one process (each rank's share, then the
all-reduce or reduce-scatter), so gradients agree to float32 rounding (~1e-7 relative), and weights to lr x 1e-3
or so after a few steps (measured: 1.4e-6 at lr 1e-3 after 3 sft steps), hence ATOL. But AdamW divides by
sqrt(v): a weight whose gradient is at rounding level (a sum that cancels) steps by about lr with the sign of its
rounding, so a rare element may differ by up to 2 x lr a step (seen once in a full suite: 1.0e-3 after 3 steps).
Such elements are allowed up to STRAY_SHARE of a model and STRAY apart. The first moments follow the gradients
linearly and agree to 1e-6, but those whose later gradients a stray weight changed may differ by a share of a
gradient (seen once in a full suite): the same share of them may be up to MOMENT_STRAY apart.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bebop.cli import main
from bebop.model.checkpoint import load_model

ATOL = 2e-5
STRAY = 1e-2  # 2 x lr x steps at the largest lr and step count here (1e-3, at most 4 steps) and then some
STRAY_SHARE = 1e-3  # of a model's elements, at most, beyond ATOL
MOMENT_STRAY = 1e-3  # a first moment near a stray weight: its later gradients differ (about 0.1 of a gradient)
TINY_SFT = ("--task", "math", "--batch-size", "8", "--micro-batch-size", "2", "--lr", "1e-3", "--warmup", "1",
            "--device", "cpu")


def bebop(*argv: str, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bebop", *argv], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})


def ok(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def weights(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_model(model_dir).state_dict()


def assert_close(a: dict, b: dict, atol: float = ATOL, stray: float = STRAY) -> None:
    """Every element within `stray`, and all but STRAY_SHARE of them within `atol` (the module's docstring)."""
    assert a.keys() == b.keys()
    gaps = torch.cat([(a[k] - b[k]).abs().flatten() for k in a])
    strays = int((gaps > atol).sum())
    assert gaps.max().item() <= stray and strays <= STRAY_SHARE * gaps.numel(), (gaps.max().item(), strays)


def test_the_tolerance_allows_rare_strays_only():
    """assert_close passes a few elements beyond atol, and refuses too many of them or one beyond `stray`."""
    a = {"w": torch.zeros(10_000)}
    few, many, far = (torch.zeros(10_000) for _ in range(3))
    few[:5], many[:50], far[0] = 1e-3, 1e-3, 0.1
    assert_close(a, {"w": few})
    for b in (many, far):
        with pytest.raises(AssertionError):
            assert_close(a, {"w": b})
    with pytest.raises(AssertionError):
        assert_close(a, {"w": few}, atol=1e-6, stray=1e-4)


def assert_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from conftest import _tiny_dir

    return _tiny_dir(tmp_path_factory.mktemp("dist_tiny"), context=256)


@pytest.fixture(scope="module")
def headed(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("dist_headed") / "m"
    assert main(["mtp", "init", "--model", str(tiny), "--out", str(out)]) == 0
    return out


def test_sft_on_two_ranks_is_the_one_process_step(tiny, tmp_path):
    """FSDP2 and DDP over 2 ranks: the same weights, losses and AdamW state as one process on the whole batches."""
    runs = {}
    for name, extra in (("one", ()), ("fsdp", ("--nproc", "2")), ("ddp", ("--nproc", "2", "--parallel", "ddp"))):
        runs[name] = ok(bebop("sft", "--model", str(tiny), "--out", str(tmp_path / name), "--steps", "3",
                              *TINY_SFT, *extra))
    assert runs["fsdp"]["learner"] == {"world_size": 2, "parallel": "fsdp"}
    assert runs["ddp"]["learner"] == {"world_size": 2, "parallel": "ddp"} and len(runs["ddp"]["peak_memory_mb"]) == 2
    one = torch.load(tmp_path / "one" / "train_state.pt", weights_only=True)
    for name in ("fsdp", "ddp"):
        assert_close(weights(tmp_path / "one"), weights(tmp_path / name))
        state = torch.load(tmp_path / name / "train_state.pt", weights_only=True)
        assert state["history"] == one["history"] and state["learner"]["parallel"] == name
        assert state["optimizer"]["param_groups"][0]["params"] == one["optimizer"]["param_groups"][0]["params"]
        moments = state["optimizer"]["state"]  # one process's layout: the same keys and first moments
        assert moments.keys() == one["optimizer"]["state"].keys()
        assert_close({i: m["exp_avg"] for i, m in moments.items()},
                     {i: m["exp_avg"] for i, m in one["optimizer"]["state"].items()}, atol=1e-6, stray=MOMENT_STRAY)
    assert torch.load(tmp_path / "fsdp" / "train_state.pt", weights_only=True)["learner"]["world_size"] == 2


def test_mtp_train_on_two_ranks_is_the_one_process_step(headed, tmp_path):
    """The trunk frozen and sharded, the head trained: the same head, held-out measures and best step."""
    argv = ("--model", str(headed), "--task", "math", "--num-samples", "16", "--max-new-tokens", "24", "--steps", "4",
            "--batch-size", "4", "--depths", "3", "--held-out", "4", "--eval-every", "2", "--device", "cpu")
    one = ok(bebop("mtp", "train", *argv, "--out", str(tmp_path / "one")))
    two = ok(bebop("mtp", "train", *argv, "--out", str(tmp_path / "two"), "--nproc", "2"))
    assert_close(weights(tmp_path / "one"), weights(tmp_path / "two"))
    assert two["best_step"] == one["best_step"] and two["learner"]["world_size"] == 2
    assert two["heldout_rs_acceptance_best"] == pytest.approx(one["heldout_rs_acceptance_best"], abs=1e-5)
    assert two["acceptance_per_depth"] == pytest.approx(one["acceptance_per_depth"], abs=1e-4)


RL = ("--task", "math", "--steps", "3", "--batch-prompts", "2", "--group-size", "4", "--max-new-tokens", "24",
      "--spec", "rs", "--k", "2", "--lr", "1e-3", "--micro-batch-size", "2", "--entropy-coef", "0.1", "--device", "cpu",
      "--no-progress")  # the entropy bonus moves the weights where the tiny policy's rewards are all 0


@pytest.mark.parametrize("mode", [("--parallel", "fsdp"),
                                  ("--parallel", "ddp", "--mode", "async", "--max-staleness", "1", "--ppo-epochs",
                                   "2", "--mini-batches", "2")], ids=["sync-fsdp", "async-ddp-minibatches"])
def test_three_rl_steps_on_two_ranks_are_the_one_process_steps(headed, tmp_path, mode):
    one = ok(bebop("rl", "--model", str(headed), "--out", str(tmp_path / "one"), *RL, *mode))
    two = ok(bebop("rl", "--model", str(headed), "--out", str(tmp_path / "two"), *RL, *mode, "--nproc", "2"))
    assert two["mean_acceptance_length_mean_last5"] == one["mean_acceptance_length_mean_last5"]  # rank 0 sampled the same
    assert two["learner"] == {"world_size": 2, "parallel": mode[1]} and one["learner"]["world_size"] == 1
    assert len(two["peak_memory_mb"]) == len(two["state_mb"]) == 2 and min(two["state_mb"]) > 0  # per rank, as sft's
    assert_close(weights(tmp_path / "one" / "model"), weights(tmp_path / "two" / "model"))
    rows = [[json.loads(line) for line in open(tmp_path / run / "metrics.jsonl")] for run in ("one", "two")]
    for a, b in zip(*rows, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5) and b["grad_norm"] == pytest.approx(a["grad_norm"],
                                                                                                  rel=1e-3)
        assert b["train_entropy"] == pytest.approx(a["train_entropy"], abs=1e-5) and a["grad_norm"] > 0


@pytest.mark.slow
def test_rl_on_ray_with_two_learner_ranks_is_the_one_process_run(headed, tmp_path):
    """--backend ray: rank 0 drives the Ray rollout actors, both ranks update (a local Ray is started per run)."""
    pytest.importorskip("ray")
    argv = ("rl", "--model", str(headed), *RL, "--backend", "ray", "--max-staleness", "0")
    ok(bebop(*argv, "--out", str(tmp_path / "one"), timeout=600))
    ok(bebop(*argv, "--out", str(tmp_path / "two"), "--nproc", "2", timeout=600))
    assert_close(weights(tmp_path / "one" / "model"), weights(tmp_path / "two" / "model"))


def _rank_pids(launcher: int, rank: int) -> list[int]:
    """The processes started by `launcher` that run as `rank` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            env = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == launcher and f"RANK={rank}".encode() in env:
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the rank's process in /proc")
def test_a_dead_rank_stops_the_run_and_its_last_save_resumes_on_two_or_one_rank(tiny, tmp_path):
    argv = ("sft", "--model", str(tiny), "--steps", "40", "--save-every", "2", *TINY_SFT, "--nproc", "2")
    ok(bebop(*argv, "--out", str(tmp_path / "whole")))
    run = subprocess.Popen([sys.executable, "-m", "bebop", *argv, "--out", str(tmp_path / "cut")],
                           stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    deadline = time.time() + 120
    while not (tmp_path / "cut" / "train_state.pt").exists() and time.time() < deadline:
        time.sleep(0.05)
    for pid in _rank_pids(run.pid, 1):
        os.kill(pid, signal.SIGKILL)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 1 and "rank 1 of 2 stopped (killed by SIGKILL)" in err and "--resume" in err
    saved = torch.load(tmp_path / "cut" / "train_state.pt", weights_only=True)  # intact
    assert 2 <= saved["step"] < 40 and not (tmp_path / "cut" / "sft_meta.json").exists()
    os.rename(tmp_path / "cut", tmp_path / "cut2")
    subprocess.run(["cp", "-r", str(tmp_path / "cut2"), str(tmp_path / "cut1")], check=True)
    ok(bebop(*argv, "--out", str(tmp_path / "cut2"), "--resume"))
    assert_equal(weights(tmp_path / "whole"), weights(tmp_path / "cut2"))  # N = M: bit-exact
    ok(bebop(*argv[:-2], "--out", str(tmp_path / "cut1"), "--resume"))  # 2 -> 1 rank
    assert_close(weights(tmp_path / "whole"), weights(tmp_path / "cut1"), atol=1e-4)
    histories = [torch.load(tmp_path / d / "train_state.pt", weights_only=True)["history"] for d in ("whole", "cut1")]
    assert histories[1][: saved["step"]] == histories[0][: saved["step"]]
    assert histories[1] == pytest.approx(histories[0], abs=2e-4)
    bad = bebop(*argv, "--out", str(tmp_path / "cut2"), "--resume", "--lr", "2e-3")  # a resume that does not match
    lines = [line for line in bad.stderr.splitlines() if line.strip()]
    assert bad.returncode == 2 and lines == [lines[-1]] and "config differs in lr" in lines[-1]


@pytest.mark.parametrize("argv, message", [
    (["sft", "--task", "math", "--nproc", "999"], "more ranks than this machine can run"),
    (["sft", "--task", "math", "--nproc", "2", "--batch-size", "7"], "--batch-size (7) must be divisible"),
    (["mtp", "train", "--model", "M", "--nproc", "2", "--batch-size", "5"], "--batch-size (5) must be divisible"),
    (["rl", "--model", "M", "--task", "math", "--steps", "2", "--nproc", "2", "--batch-prompts", "3",
      "--group-size", "3"], "equal shares"),
    (["rl", "--model", "M", "--task", "math", "--steps", "2", "--nproc", "2", "--mtp-update", "ce"],
     "--mtp-update none"),
    (["sft", "--task", "math", "--nproc", "0"], "--nproc must be >= 1"),
], ids=["too-many", "sft-batch", "mtp-batch", "rl-rows", "rl-online-head", "zero"])
def test_bad_learner_requests_are_refused_before_any_rank_starts(argv, message, tmp_path, capsys):
    out = tmp_path / "out"
    argv = [a.replace("M", str(tmp_path / "none")) if a == "M" else a for a in argv]
    assert main([*argv, "--out", str(out), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and not out.exists()


def test_optimizer_state_keys_round_trip_and_a_foreign_state_is_refused():
    """torch.distributed.checkpoint keys the optimizer state by parameter name; checkpoints keep torch.optim's
    index keys (one process's layout), and a state of another model is refused in one line."""
    from bebop.distributed.parallel import _by_index, _by_name
    from bebop.errors import BebopError

    names = [["a.weight", "a.bias"], ["b.weight"]]
    named = {"state": {"a.weight": {"step": 1}, "b.weight": {"step": 2}},
             "param_groups": [{"lr": 1.0, "params": names[0]}, {"lr": 2.0, "params": names[1]}]}
    indexed = _by_index(named)
    assert indexed["state"] == {0: {"step": 1}, 2: {"step": 2}}
    assert [g["params"] for g in indexed["param_groups"]] == [[0, 1], [2]]
    assert _by_name(indexed, names) == named
    with pytest.raises(BebopError, match="does not match this model"):
        _by_name(indexed, [["a.weight"], ["b.weight"]])


def test_the_launcher_reports_the_rank_that_stopped_the_run():
    """When one rank dies the others fail on their broken connections within the same poll, and the launcher
    SIGTERMs whoever is left: the rank reported is the cause (a refused input, else a signal from outside)."""
    from types import SimpleNamespace as F

    from bebop.distributed.launch import _cause

    kill, term = -signal.SIGKILL, -signal.SIGTERM
    cases = [({0: F(exitcode=1, timestamp=1.0), 1: F(exitcode=kill, timestamp=2.0)}, 1),
             ({0: F(exitcode=term, timestamp=1.0), 1: F(exitcode=kill, timestamp=2.0)}, 1),
             ({0: F(exitcode=2, timestamp=2.0), 1: F(exitcode=kill, timestamp=1.0)}, 0),
             ({0: F(exitcode=1, timestamp=2.0), 1: F(exitcode=term, timestamp=1.0)}, 0),
             ({0: F(exitcode=1, timestamp=2.0), 1: F(exitcode=1, timestamp=1.0)}, 1)]
    for failures, rank in cases:
        assert _cause(failures)[0] == rank, failures
