"""`--backend ray --engine vllm` (marker `vllm`): each Ray rollout actor samples on a vLLM worker of its own, kept
on the actor's weights. Two actors give the local vLLM run's per-step metrics (same data order, same versions, same
seeds), and an actor killed mid-batch is replaced, with a new vLLM worker serving the current weights, while the old
one's worker and files go with it."""

import os
import signal
from pathlib import Path

import pytest
import torch

from bebop.policy import load_policy
from bebop.rl import train_rl
from bebop.rl.config import Backend
from bebop.rl.loop import ray_vllm
from bebop.rl.sampler import RolloutSampler
from bebop.tasks import get_task
from bebop.vllm.serve import VllmServer
from vllm_helpers import PYTHON, gone, require_vllm, wait_until

from rl_helpers import SlowSampler, VariedReward, read_metrics, rl_cfg

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module", autouse=True)
def has_vllm():
    require_vllm()


def vllm_cfg(model_dir, **kw):
    return rl_cfg(model_dir, engine="vllm", vllm_python=PYTHON, mode="async", lr=1e-2, **kw)


def test_two_ray_actors_on_vllm_give_the_local_vllm_runs_metrics(vllm_dense_dir, tmp_path, ray_session, monkeypatch):
    """Batch i is sampled with the generator of (seed, i) and the weights of the version it is stamped with on
    both backends (Ray issues indices in data order, two actors one batch ahead at --max-staleness 1, as the local
    async source samples one ahead): the metrics agree up to the float rounding between processes."""
    monkeypatch.setattr("bebop.rl.loop.run_task",  # pickled into the actors with the sampler
                        lambda policy, *, task, difficulty, **_: VariedReward(get_task(task, difficulty)))
    cfg = vllm_cfg(vllm_dense_dir, steps=4, batch_prompts=2, group_size=4, max_new_tokens=16, max_staleness=1)
    local = read_metrics(Path(train_rl(tmp_path / "local", cfg, progress=False)["run_dir"]))
    remote = read_metrics(Path(train_rl(tmp_path / "ray", cfg, progress=False,
                                        backend=Backend("ray", rollout_workers=2))["run_dir"]))
    assert [r["policy_version"] for r in remote] == [r["policy_version"] for r in local] == [0, 0, 1, 2]
    assert len({r["reward"] for r in local}) > 1 and local[-1]["loss"] != 0  # the weights move every step
    for key in ("reward", "generated_tokens", "sampler_kl", "is_weight_mean"):
        assert [r[key] for r in remote] == pytest.approx([r[key] for r in local], abs=1e-5), key
    assert any(r["sampler_kl"] > 1e-4 for r in remote[2:])  # a batch one version behind: the sync is seen


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def test_a_killed_actor_is_replaced_with_a_vllm_worker_serving_the_current_weights(vllm_dense_dir, ray_session,
                                                                                  tmp_path):
    """The actors are told of a model directory that does not exist (as on another node): they serve vLLM from
    their own models."""
    from bebop.rl.ray_backend import RaySource

    policy = load_policy(vllm_dense_dir, device="cpu")
    cfg = vllm_cfg(vllm_dense_dir, batch_prompts=2, group_size=2, max_new_tokens=12, max_staleness=0)
    elsewhere = {**ray_vllm(cfg), "source_dir": str(tmp_path / "not-on-this-node")}
    source = RaySource(SlowSampler(VariedReward(get_task("math")), policy, cfg), policy.model, start_index=0,
                       max_staleness=0, workers=1, vllm=elsewhere)
    try:
        first = source.next_batch(0)
        [pid] = source.worker_pids()
        [vllm_pid] = _children(pid)  # the actor's vLLM worker
        with torch.no_grad():  # the trainer moves the weights
            g = torch.Generator().manual_seed(1)
            for p in policy.model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
        source.publish(policy.model, 1)  # batch 1 issued now, with version 1
        os.kill(pid, signal.SIGKILL)  # mid-batch (it takes 1 s)
        second = source.next_batch(1)
        assert source.restarts == 1 and source.worker_pids() != [pid]
        assert wait_until(lambda: gone(vllm_pid))  # the orphaned vLLM worker notices its parent is gone
    finally:
        source.close()
    assert (first.batch.index, second.batch.index, second.batch.policy_version) == (0, 1, 1)
    # the new actor's vLLM served the current weights: the rollouts a vLLM worker here samples with them
    here = RolloutSampler(VariedReward(get_task("math")), policy, cfg)
    with VllmServer(policy.model, vllm_dense_dir, **cfg.vllm_server()) as server:
        here.vllm = server
        want = here.collect(policy.model, index=1, policy_version=1)
    assert [r.token_ids for r in second.batch.rollouts] == [r.token_ids for r in want.rollouts]
