"""RL on Ray (`--backend ray`): same rollouts as the local async source, a killed rollout worker is
restarted with the current weights and its batch issued again (none lost, none trained twice), a
crashed run resumes from its checkpoint, and the local backend never imports Ray.

The Ray tests share one local Ray (num_cpus=2) whose workers get tests/ on PYTHONPATH, so the
task and sampler wrappers below unpickle there; RaySource uses an initialised Ray as it is.
"""

import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch

from bebop.errors import BebopError
from bebop.policy import load_policy
from bebop.rl import train_rl
from bebop.rl.checkpoint import load_checkpoint
from bebop.rl.config import Backend
from bebop.rl.sampler import STREAM_STRIDE, RolloutSampler
from bebop.tasks import get_task

from rl_helpers import DigitTask, SlowSampler, check_rollouts_end_their_turn, read_metrics, rl_cfg, spy_rollouts

TESTS_DIR = Path(__file__).resolve().parent
ROOT = TESTS_DIR.parent


def _run(args, **kw):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=120, **kw)


# --- without Ray -------------------------------------------------------------------------------

def test_local_backend_never_imports_ray(headed, tmp_path):
    """In a fresh interpreter (this one may hold Ray): the CLI, bebop.rl and a local async step."""
    script = (f"import sys; import bebop.cli, bebop.rl\n"
              f"from bebop.rl import RLConfig, train_rl\n"
              f"train_rl({str(tmp_path / 'run')!r}, RLConfig(model={str(headed)!r}, mode='async', steps=1, "
              f"group_size=2, batch_prompts=1, max_new_tokens=8), progress=False)\n"
              f"assert 'ray' not in sys.modules, 'ray was imported'\n")
    done = _run(["-c", script])
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "run" / "model").is_dir()


def test_without_ray_installed_the_error_says_how_to_install(headed, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(BebopError, match=r"--backend ray needs Ray: pip install 'bebop\[ray\]'"):
        train_rl(tmp_path / "run", rl_cfg(headed, mode="async"), progress=False, backend=Backend("ray"))
    assert not (tmp_path / "run").exists()  # refused before anything is written


def test_backend_options_are_checked(headed, tmp_path):
    cases = [(dict(mode="async"), Backend("local", rollout_workers=2), "need --backend ray"),
             (dict(mode="async"), Backend("local", ray_address="auto"), "need --backend ray"),
             (dict(mode="sync"), Backend("ray"), "use --mode async"),
             (dict(mode="async", max_staleness=1), Backend("ray", rollout_workers=3), "max_staleness \\+ 1 = 2"),
             (dict(mode="async"), Backend("slurm"), "unknown --backend")]
    for kw, backend, message in cases:
        with pytest.raises(BebopError, match=message):
            train_rl(tmp_path / "run", rl_cfg(headed, **kw), progress=False, backend=backend)
    assert not (tmp_path / "run").exists()


def test_unreachable_ray_address_fails_fast_naming_it(headed, tmp_path):
    pytest.importorskip("ray")
    t0 = time.monotonic()
    done = _run(["-m", "bebop", "rl", "--model", str(headed), "--task", "math", "--steps", "1",
                 "--out", str(tmp_path / "run"), "--backend", "ray", "--ray-address", "127.0.0.1:1", "--no-progress"])
    assert done.returncode != 0 and "cannot reach the Ray cluster at 127.0.0.1:1" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and not (tmp_path / "run").exists()
    assert time.monotonic() - t0 < 60  # Ray alone would retry for minutes


def test_a_ray_connection_error_becomes_a_bebop_error_naming_the_address(monkeypatch):
    from bebop.rl import ray_connect

    def refuse(**kw):
        raise ConnectionError("Could not find any running Ray instance.")

    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(is_initialized=lambda: False, init=refuse))
    with pytest.raises(BebopError, match="cannot connect to the Ray cluster at auto: Could not find"):
        ray_connect.connect("auto", 1)


# --- on Ray ------------------------------------------------------------------------------------

def test_ray_and_local_async_sample_the_same_rollout_distribution(headed, tmp_path, digit_reward, ray_session):
    """One worker, same seed: the Ray run and the local async run hand out the same (data index,
    policy version) schedule (versions 0, 0, 1, 2, ...: one batch sampled ahead while the trainer
    trains), and batch i is sampled with the generator seeded (seed, i) in both. So the two runs
    draw from the same distributions with the same random numbers: the expected difference of
    every per-step reward and acceptance length is exactly 0, a stronger check than "within the
    noise of independent runs" (whose standard error on 6 steps x 8 rollouts, ~0.07 in reward,
    would hide a wrong engine). The tolerance 1e-6 is the metrics' rounding. What could still
    differ is float rounding between the two processes (the worker runs 1 thread) flipping a
    sample whose uniform lies within ~1e-7 of a CDF boundary: about 1e-7 per draw times ~2e3
    draws, a false-failure probability near 1e-4."""
    cfg = rl_cfg(headed, mode="async", spec="rs", k=2, steps=6, batch_prompts=4, max_new_tokens=24)
    local = _metrics_of(train_rl(tmp_path / "local", cfg, progress=False))
    remote = _metrics_of(train_rl(tmp_path / "ray", cfg, progress=False, backend=Backend("ray", rollout_workers=1)))
    assert [r["policy_version"] for r in remote] == [r["policy_version"] for r in local] == [0, 0, 1, 2, 3, 4]
    assert len({r["reward"] for r in local}) > 1  # the rewards vary: a real comparison
    for key in ("reward", "mean_acceptance_length", "generated_tokens", "entropy"):
        assert [r[key] for r in remote] == pytest.approx([r[key] for r in local], abs=1e-6), key
    assert all(r["mean_acceptance_length"] > 1.0 and r["dropped"] == 0 for r in remote)


def test_more_workers_than_the_cluster_has_cpus_is_refused_at_once(headed, ray_session):
    from bebop.rl.ray_backend import RaySource

    policy = load_policy(headed, device="cpu")
    sampler = RolloutSampler(get_task("math"), policy, rl_cfg(headed, mode="async"))
    with pytest.raises(BebopError, match="3 rollout workers need 3 CPUs but the Ray cluster has 2"):
        RaySource(sampler, policy.model, start_index=0, max_staleness=2, workers=3)


def _metrics_of(summary):
    return read_metrics(Path(summary["run_dir"]))


def test_a_killed_worker_is_restarted_with_the_current_weights(headed, ray_session):
    from bebop.rl.ray_backend import RaySource

    policy = load_policy(headed, device="cpu")
    cfg = rl_cfg(headed, mode="async", spec="rs", k=2, batch_prompts=1)
    sampler = SlowSampler(get_task("math"), policy, cfg)
    source = RaySource(sampler, policy.model, start_index=0, policy_version=0, max_staleness=0, workers=1)
    try:
        first = source.next_batch(0)
        [pid] = source.worker_pids()  # asked while it is idle (actor calls run one at a time)
        with torch.no_grad():  # the trainer moves trunk and head
            g = torch.Generator().manual_seed(1)
            for p in policy.model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
        source.publish(policy.model, 1)  # max_staleness 0: batch 1 is issued now, with version 1
        os.kill(pid, signal.SIGKILL)  # mid-batch (it takes 1 s)
        second = source.next_batch(1)
        assert source.restarts == 1 and source.worker_pids() != [pid]
    finally:
        source.close()
    assert (first.batch.index, second.batch.index, second.batch.policy_version) == (0, 1, 1)
    assert source.next_index == 2 and second.dropped == 0
    # the new worker sampled with the current trunk AND head: the same rollouts as this process
    here = RolloutSampler(get_task("math"), policy, cfg).collect(policy.model, index=1, policy_version=1)
    assert [r.token_ids for r in second.batch.rollouts] == [r.token_ids for r in here.rollouts]
    got, want = second.batch.spec.to_dict(), here.spec.to_dict()
    # counts are exact; the entropy is a float sum from another process's kernels (thread counts may differ)
    assert got.pop("mean_entropy") == pytest.approx(want.pop("mean_entropy"), rel=1e-6)
    assert got == want


class FlakyTask(DigitTask):
    """The digit reward, plus faults injected in rollout workers (never in the driver), once each:
    the worker sampling batch `kill_index` kills its own process (SIGKILL), and the one sampling
    batch `crash_index` raises. Every batch a worker starts is logged as "pid index"."""

    def __init__(self, inner, seed, kill_index, crash_index, scratch):
        super().__init__(inner)
        self.index_of = {seed * STREAM_STRIDE + i: i for i in range(100)}
        self.kill_index, self.crash_index, self.scratch = kill_index, crash_index, str(scratch)
        self.driver_pid = os.getpid()

    def problems(self, split, n, seed):
        index = self.index_of[seed]
        if os.getpid() != self.driver_pid:
            scratch = Path(self.scratch)
            with open(scratch / "issued.log", "a") as fh:
                fh.write(f"{os.getpid()} {index}\n")
            if index == self.kill_index and not (scratch / "killed").exists():
                (scratch / "killed").touch()
                os.kill(os.getpid(), signal.SIGKILL)
            if index == self.crash_index and not (scratch / "crashed").exists():
                (scratch / "crashed").touch()
                raise RuntimeError(f"injected crash in batch {index}")
        return super().problems(split, n, seed)


def test_worker_death_and_a_crashed_run_lose_no_batch_and_count_none_twice(headed, tmp_path, monkeypatch,
                                                                            ray_session):
    steps, kill_index, crash_index = 6, 1, 4
    monkeypatch.setattr("bebop.rl.loop.run_task", lambda policy, *, task, difficulty, **_: FlakyTask(
        get_task(task, difficulty), 0, kill_index, crash_index, tmp_path))
    cfg = rl_cfg(headed, mode="async", spec="rs", k=2, steps=steps, save_every=1)
    run, backend = tmp_path / "run", Backend("ray", rollout_workers=2)
    with pytest.raises(RuntimeError, match="injected crash in batch 4"):  # the sampler's error, not retried
        train_rl(run, cfg, progress=False, backend=backend)
    crashed_at = load_checkpoint(run).state["step"]
    assert 1 + kill_index <= crashed_at <= crash_index
    summary = train_rl(run, cfg, resume=True, progress=False, backend=backend)
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))  # each step once, across the crash
    assert all(r["dropped"] == 0 and 0 <= r["staleness"] <= 1 for r in rows)
    assert load_checkpoint(run).state["data_index"] == steps  # batches 0..5 each trained on exactly once
    assert summary["policy_version"] == steps
    issued = [tuple(map(int, line.split())) for line in (tmp_path / "issued.log").read_text().splitlines()]
    by_index = {}
    for pid, index in issued:
        by_index.setdefault(index, []).append(pid)
    assert len(by_index[kill_index]) == 2 and len(set(by_index[kill_index])) == 2  # killed, then a new worker
    assert len(by_index[crash_index]) == 2  # the crashed attempt, then the resumed run
    # any other batch is sampled once, or again only when the resumed run starts before it
    again = [i for i in range(steps) if i not in (kill_index, crash_index) and len(by_index[i]) > 1]
    assert all(i >= crashed_at for i in again) and all(len(by_index[i]) <= 2 for i in range(steps))


def test_your_own_data_and_reward_file_on_ray_workers(headed, tmp_path, monkeypatch, ray_session):
    """A --data run with a reward file given by a relative path: the task travels to the worker without
    the imported function and re-imports it there by its absolute path (the worker runs elsewhere)."""
    from data_helpers import verl_row, with_chat_template, write_rows

    model = with_chat_template(headed, tmp_path / "model")
    (tmp_path / "reward.py").write_text("def two_digits(solution_str, data_source, ground_truth, extra_info):\n"
                                        "    return float(sum(c.isdigit() for c in solution_str) >= 2)\n")
    data = write_rows(tmp_path / "d.jsonl", [verl_row(f"{i}+{i}?", str(2 * i), source="mine") for i in range(4)])
    monkeypatch.chdir(tmp_path)
    cfg = rl_cfg(model, task="math", data=str(data), reward="reward.py:two_digits", mode="async", spec="rs", k=2,
                 steps=3, max_new_tokens=24)
    train_rl(tmp_path / "run", cfg, progress=False, backend=Backend("ray", rollout_workers=1))
    metrics = read_metrics(tmp_path / "run")
    assert [m["step"] for m in metrics] == [1, 2, 3] and all(m["reward_errors"] == 0 for m in metrics)
    assert any(m["reward"] > 0 for m in metrics)  # the worker scored with the user's function


def test_ray_rollouts_stop_at_generation_config_ids(turn_model, tmp_path, ray_session, monkeypatch):
    rollouts = spy_rollouts(monkeypatch)
    cfg = rl_cfg(turn_model, steps=1, batch_prompts=4, max_new_tokens=24, mode="async")
    train_rl(tmp_path / "run", cfg, progress=False, backend=Backend("ray", rollout_workers=1))
    check_rollouts_end_their_turn(rollouts, turn_model)
