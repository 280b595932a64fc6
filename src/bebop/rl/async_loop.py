"""Async rollouts: a worker thread samples with its own copy of the policy while the trainer trains.

    source = AsyncSource(sampler, model, start_index=0, policy_version=0, max_staleness=1)
    fetched = source.next_batch(trainer_version)   # blocks until a fresh-enough batch is ready
    source.publish(model, version)                 # snapshot trunk AND head for the worker
    source.close()

The worker owns a deep copy of the policy (the rollout model). Before each batch it loads
the newest published snapshot with `sync_weights` (the full state dict, `mtp.*` included; strict,
so a missing head tensor is an error, never a silently stale draft) and stamps every rollout with
that snapshot's policy version. The queue is bounded: the worker claims a slot before it
generates, with max(1, max_staleness) slots, so it runs at most that many batches ahead, and
before it samples batch i it waits until the trainer has published the version that batch needs
(`required_version`: the trainer makes one update per batch, so batch i is trained at version
v0 + (i - i0) and must be sampled at v0 + (i - i0) - max_staleness or later). With
max_staleness=0 the worker samples only between updates: the run is on-policy and loses no batch
(the same batches and metrics as --mode sync); with 1 it samples batch i+1 while batch i trains.
The trainer still drops a batch whose staleness (trainer version - batch version) exceeds
max_staleness (a guard; the wait makes it unreachable in a normal run) and counts it. torch
releases the GIL inside ops, so generation and training overlap on one machine;
`rollout_threads` / `train_threads` split the cores between them (torch's thread count is per
thread), which on a small machine can beat both sharing every core (docs/benchmarks.md measures it).
"""

from __future__ import annotations

import copy
import queue
import threading
import time
from typing import TYPE_CHECKING

import torch

from bebop.errors import BebopError
from bebop.rl.source import Fetched, is_fresh, snapshot, sync_weights

if TYPE_CHECKING:
    from bebop.model.qwen3 import CausalLM
    from bebop.rl.records import RolloutBatch
    from bebop.rl.sampler import RolloutSampler

POLL_S = 0.05


def required_version(index: int, start_index: int, start_version: int, max_staleness: int) -> int:
    """The oldest weights batch `index` may be sampled with to be fresh when trained (one update per batch)."""
    return start_version + (index - start_index) - max_staleness


class AsyncSource:
    def __init__(self, sampler: RolloutSampler, model: CausalLM, *, start_index: int, policy_version: int = 0,
                 max_staleness: int = 1) -> None:
        self.sampler, self.max_staleness, self.next_index = sampler, max_staleness, start_index
        self.rollout_model = copy.deepcopy(model).eval().requires_grad_(False)
        self.rollout_version = self.published = policy_version
        self.start = (start_index, policy_version)
        self.latest: tuple[int, dict[str, torch.Tensor]] | None = None
        self.lock = threading.Lock()
        self.published_cond = threading.Condition(self.lock)
        self.queue: queue.Queue = queue.Queue()
        self.slots = threading.Semaphore(max(1, max_staleness))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._work, args=(start_index,), name="bebop-rollout", daemon=True)
        self.thread.start()

    # worker side
    def _work(self, index: int) -> None:
        threads = getattr(getattr(self.sampler, "cfg", None), "rollout_threads", 0)  # a sampler without a config: 0
        if threads:  # per thread (OpenMP): the trainer keeps its own count
            # torch sets up a thread's count on its first parallel op, to the count some thread set last: done
            # here first, the thread's own count then stays whatever the trainer sets meanwhile
            torch.get_num_threads()
            torch.set_num_threads(threads)
        while not self.stop.is_set():
            if not self.slots.acquire(timeout=POLL_S):
                continue
            if not self._await_version(required_version(index, *self.start, self.max_staleness)):
                return
            try:
                self._load_latest()
                batch = self.sampler.collect(self.rollout_model, index=index, policy_version=self.rollout_version)
            except BaseException as exc:  # handed to the trainer, raised there
                self.queue.put(exc)
                return
            self.queue.put(batch)
            index += 1

    def _await_version(self, version: int) -> bool:
        """Block until `version` (or a newer one) is published; False when the source is closing."""
        with self.published_cond:
            while self.published < version and not self.stop.is_set():
                self.published_cond.wait(POLL_S)
        return not self.stop.is_set()

    def _load_latest(self) -> None:
        with self.lock:
            latest, self.latest = self.latest, None
        if latest is not None:
            self.rollout_version, state = latest
            sync_weights(self.rollout_model, state)

    # trainer side
    def publish(self, model: CausalLM, version: int) -> None:
        state = snapshot(model)
        with self.published_cond:
            self.latest = (version, state)
            self.published = version
            self.published_cond.notify_all()

    def suspend_drafting(self, suspended: bool) -> None:
        """Batches the worker starts from now on (one may be in flight) draft or not."""
        self.sampler.drafting_suspended = suspended

    def next_batch(self, trainer_version: int) -> Fetched:
        t0, dropped = time.perf_counter(), 0
        while True:
            item = self._get()
            self.slots.release()
            if isinstance(item, BaseException):
                raise item
            if is_fresh(item.policy_version, trainer_version, self.max_staleness):
                self.next_index = item.index + 1
                return Fetched(item, dropped, time.perf_counter() - t0)
            dropped += 1

    def _get(self) -> RolloutBatch | BaseException:
        while True:
            try:
                return self.queue.get(timeout=POLL_S)
            except queue.Empty:
                if not self.thread.is_alive() and self.queue.empty():
                    raise BebopError("the rollout worker stopped without a batch") from None

    def close(self) -> None:
        self.stop.set()
        self.slots.release()
        self.thread.join()
