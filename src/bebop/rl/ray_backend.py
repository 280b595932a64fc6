"""Rollouts on Ray: rollout workers are Ray actors, the learner stays in the driver process.

    source = RaySource(sampler, model, start_index=0, policy_version=0, max_staleness=1, workers=2)
    fetched = source.next_batch(trainer_version)   # the next batch in data order, fresh enough
    source.publish(model, version)                 # trunk AND head: ray.put once, one ref for all
    source.close()

It is the third entry of the loop's source table (`bebop rl --backend ray`), with the verbs of the
local async source (async_loop.AsyncSource) and the shared pieces of source.py: `is_fresh` (staleness
rule), `sync_weights` (strict load, `mtp.*` included), `Fetched`. Metrics and checkpoints are the
loop's. Ray is imported only when a RaySource is made (ray_connect.py): the local backends never
import it.

Glossary:
    worker      a Ray actor (RolloutWorker) owning a rollout model (trunk + MTP head) and the sampler
    data index  batch i of the run's prompt stream (a pure function of (seed, i): sampler.py)
    issued      an index handed to exactly one worker; `pending` maps its result ref to the worker
    ready       finished batches not yet consumed (they may finish out of order)

With `--engine vllm` each worker also owns a vLLM worker process (bebop.vllm.serve.VllmServer) that samples its
batches: it is started from the worker's model and synced with every state dict the worker loads, and it dies
with the worker (a replaced worker starts a new one).

Models: every worker builds its rollout model from a state dict sent through the object store (the
driver's current weights, head included), never from a model directory: a directory need not
exist on other nodes, and a restarted worker must start from the newest weights anyway. Weights:
`publish` puts the snapshot in the object store once; each worker gets that same ref with its next
batch when it holds an older version (a worker that is busy loads it before its next batch, and
a version it never sampled with is skipped instead of loaded).

Order and staleness: batches are consumed strictly in data order, so the checkpointed data
position (`next_index`) means "every index below it was trained on (or dropped as stale)", as in
the local modes. A batch handed out now is trained on after the n batches issued before it (and
after the one being trained, between next_batch and publish), so its staleness will be n (or
n + 1): an idle worker gets an index only while that stays <= max_staleness. Hence at most
max_staleness + 1 workers are ever busy (more is refused), nothing is sampled only to be dropped,
and with max_staleness=0 the run is on-policy (a worker samples only between updates). The drop
rule still guards the trainer.

Fault tolerance: a worker that dies (its process killed, its node lost) fails its pending ref
with RayActorError; the source starts a new actor with the current weights and issues the same
index to it. An index is issued to one worker at a time and consumed once, so no batch is lost or
trained on twice; an index that kills MAX_ATTEMPTS workers in a row is an error. An exception
raised by the sampler itself (a bug, a bad task) is not retried: it is raised in the trainer.

Connecting (ray_connect.py): a local Ray started here is shut down by close(); an already
initialised Ray (ray.init called by the caller) is used as is and left running. Workers the
cluster can never place (more than its CPUs, or GPUs when the learner is on CUDA) are refused at
once (a static cluster is assumed: an autoscaler would add nodes later).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

from bebop.errors import BebopError
from bebop.model.qwen3 import CausalLM
from bebop.rl.config import check_worker_count
from bebop.rl.ray_connect import connect, require_ray
from bebop.rl.records import RolloutBatch
from bebop.rl.sampler import RolloutSampler
from bebop.rl.source import Fetched, is_fresh, sync_weights

START_TIMEOUT_S = 300.0  # a worker that is not up by then: the cluster lacks CPUs/GPUs, or the model is huge
MAX_ATTEMPTS = 3  # workers one data index may kill before the run gives up
CLOSE_TIMEOUT_S = 60.0  # for the actors to stop their vLLM workers


def cpu_state(model: CausalLM) -> dict[str, torch.Tensor]:
    """The full state dict (trunk and mtp.*) on the CPU, for ray.put (which copies it)."""
    return {name: t.detach().cpu() for name, t in model.state_dict().items()}


def build_rollout_model(config, state: dict[str, torch.Tensor], device: torch.device) -> CausalLM:
    """A rollout model from a model config and a full state dict (head included when config has one)."""
    # object-store tensors are read-only views: own a copy before the engine's weights alias them
    model = CausalLM.from_state_dict(config, {k: v.to(device, copy=True) for k, v in state.items()})
    return model.eval().requires_grad_(False)


class RolloutWorker:
    """One rollout actor: a rollout model (trunk + head) and the sampler. Made a Ray actor by RaySource."""

    def __init__(self, sampler: RolloutSampler, config, state: dict[str, torch.Tensor], version: int,
                 vllm: dict | None = None) -> None:
        """`vllm`: the actor samples on a vLLM worker of its own (VllmServer's arguments, `source_dir` among
        them), which it keeps serving its model's weights."""
        import ray

        device = torch.device("cuda" if ray.get_gpu_ids() else "cpu")
        self.sampler, self.version = sampler, version
        self.model = build_rollout_model(config, state, device)
        self.server = None
        if vllm is not None:
            from bebop.vllm.serve import VllmServer

            source_dir = vllm.pop("source_dir")
            self.server = VllmServer(self.model, source_dir, **vllm)
            sampler.vllm = self.server

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        """The vLLM worker stopped and its files removed (killed with the actor, it removes them itself)."""
        if self.server is not None:
            self.server.close()
            self.server = None

    def collect(self, index: int, version: int, state: dict[str, torch.Tensor] | None,
                suspended: bool = False) -> RolloutBatch:
        """Sample batch `index`; `state` (the weights of `version`) first, when the worker is behind;
        `suspended`: the drafter alarm is up."""
        self.sampler.drafting_suspended = suspended
        if state is not None:
            sync_weights(self.model, state)
            self.version = version
            if self.server is not None:
                self.server.sync(self.model)
        return self.sampler.collect(self.model, index=index, policy_version=self.version)


@dataclass
class Slot:
    """The driver's view of one worker: the actor, the version it holds, whether it has an index."""

    actor: Any  # a Ray ActorHandle: its methods (pid, collect) are made at run time
    version: int
    busy: bool = False


class RaySource:
    def __init__(self, sampler: RolloutSampler, model: CausalLM, *, start_index: int, policy_version: int = 0,
                 max_staleness: int = 1, workers: int = 1, address: str | None = None, vllm: dict | None = None) -> None:
        """`vllm`: each rollout actor samples on a vLLM worker of its own, started with these VllmServer
        arguments (`source_dir` among them)."""
        check_worker_count(workers, max_staleness)
        self.vllm = vllm
        self.ray = ray = require_ray()
        self.slots: list[Slot] = []
        self.owns_ray = connect(address, workers)
        self.gpu = model.device.type == "cuda"
        self.max_staleness, self.next_index, self.issue_index = max_staleness, start_index, start_index
        self.config = model.config
        self.actor_class = ray.remote(num_cpus=1, num_gpus=int(self.gpu), max_restarts=0)(RolloutWorker)
        self.pending: dict[object, tuple[Slot, int]] = {}  # result ref -> (worker, data index)
        self.ready: dict[int, RolloutBatch] = {}
        self.attempts: dict[int, int] = {}  # data index -> workers it has killed
        self.training = False  # between a returned batch and the next publish
        self.drafting_suspended = False  # the drafter alarm, passed with every index issued
        self.restarts = 0
        try:
            self._check_resources(workers)
            self.sampler_ref = ray.put(sampler)
            self.version, self.weights = policy_version, ray.put(cpu_state(model))
            self.slots = [Slot(self._spawn(), policy_version) for _ in range(workers)]
            self._await_started([s.actor for s in self.slots])
        except BaseException:
            self.close()
            raise

    # workers
    def _spawn(self):
        return self.actor_class.remote(self.sampler_ref, self.config, self.weights, self.version,
                                       dict(self.vllm) if self.vllm else None)

    def _check_resources(self, workers: int) -> None:
        """Refuse at once what the cluster can never schedule (one CPU, and a GPU with CUDA, per worker)."""
        have = self.ray.cluster_resources()
        for name, need in (("CPU", workers), ("GPU", workers * self.gpu)):
            if need > have.get(name, 0):
                raise BebopError(f"{workers} rollout workers need {need} {name}s but the Ray cluster has "
                                 f"{have.get(name, 0):g}; use fewer --rollout-workers or add nodes")

    def _await_started(self, actors: list) -> None:
        exc = self.ray.exceptions
        try:
            self.ray.get([a.pid.remote() for a in actors], timeout=START_TIMEOUT_S)
        except exc.GetTimeoutError:
            raise BebopError(f"rollout workers did not start within {START_TIMEOUT_S:.0f}s: does the Ray cluster have "
                             f"a free CPU{' and GPU' if self.gpu else ''} per worker?") from None
        except exc.RayActorError as err:
            raise BebopError(f"a rollout worker failed to start: {err}") from None

    def worker_pids(self) -> list[int]:
        """The process id of every worker (tests kill them)."""
        return self.ray.get([s.actor.pid.remote() for s in self.slots])

    def _restart(self, slot: Slot, index: int, err: BaseException) -> None:
        self.attempts[index] = self.attempts.get(index, 0) + 1
        if self.attempts[index] >= MAX_ATTEMPTS:
            raise BebopError(f"batch {index} killed {MAX_ATTEMPTS} rollout workers in a row; last: "
                             f"{str(err).splitlines()[0] if str(err) else type(err).__name__}")
        self.ray.kill(slot.actor, no_restart=True)
        slot.actor, slot.version = self._spawn(), self.version
        self._await_started([slot.actor])
        self.restarts += 1
        print(f"bebop: rollout worker {self.slots.index(slot)} died while sampling batch {index}; restarted it "
              f"with the weights of version {self.version} and issued the batch again", file=sys.stderr)

    def _issue(self, slot: Slot, index: int) -> None:
        weights = self.weights if slot.version < self.version else None
        ref = slot.actor.collect.remote(index, self.version, weights, self.drafting_suspended)
        slot.version, slot.busy = self.version, True
        self.pending[ref] = (slot, index)

    def _fill(self) -> None:
        """Hand indices to idle workers while the batches would still be fresh when trained on."""
        for slot in self.slots:
            staleness_then = len(self.pending) + len(self.ready) + self.training
            if staleness_then > self.max_staleness:
                return
            if not slot.busy:
                self._issue(slot, self.issue_index)
                self.issue_index += 1

    def _wait_for(self, index: int) -> RolloutBatch:
        ray = self.ray
        while index not in self.ready:
            done, _ = ray.wait(list(self.pending), num_returns=1)
            for ref in done:
                slot, got = self.pending.pop(ref)
                slot.busy = False
                try:
                    self.ready[got] = ray.get(ref)
                except ray.exceptions.RayActorError as err:  # the worker died: same index, new worker
                    self._restart(slot, got, err)
                    self._issue(slot, got)
                except ray.exceptions.RayTaskError as err:  # the sampler raised: the trainer's error
                    raise err.as_instanceof_cause() from None
        return self.ready.pop(index)

    # trainer side
    def next_batch(self, trainer_version: int) -> Fetched:
        t0, dropped = time.perf_counter(), 0
        self.training = False
        while True:
            self._fill()
            head = min([i for _, i in self.pending.values()] + list(self.ready))
            batch = self._wait_for(head)
            if is_fresh(batch.policy_version, trainer_version, self.max_staleness):
                self.next_index = batch.index + 1
                self.training = True
                self._fill()  # overlap: sample the next batch while this one is trained on, if fresh enough
                return Fetched(batch, dropped, time.perf_counter() - t0)
            dropped += 1

    def publish(self, model: CausalLM, version: int) -> None:
        self.version, self.weights = version, self.ray.put(cpu_state(model))
        self.training = False
        self._fill()

    def suspend_drafting(self, suspended: bool) -> None:
        """Indices issued from now on draft or not (the drafter alarm)."""
        self.drafting_suspended = suspended

    def close(self) -> None:
        if self.vllm and self.slots:  # each actor stops its vLLM worker first (a killed one's worker cleans up too)
            try:
                self.ray.get([s.actor.close.remote() for s in self.slots], timeout=CLOSE_TIMEOUT_S)
            except (self.ray.exceptions.RayError, self.ray.exceptions.GetTimeoutError):
                pass
        for slot in self.slots:
            self.ray.kill(slot.actor, no_restart=True)
        self.slots, self.pending = [], {}
        if self.owns_ray:
            self.ray.shutdown()
            self.owns_ray = False
