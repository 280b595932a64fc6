"""Where the trainer gets its next RolloutBatch: the sync source (generate now, same weights).

    source = SyncSource(sampler, model, start_index=0)
    fetched = source.next_batch(trainer_version)   # -> Fetched(batch, dropped, wait_s)
    source.publish(model, version)                 # after each update (a no-op here)
    source.suspend_drafting(True)                  # the drafter alarm: batches sampled from now on
    source.close()

The async sources (async_loop.AsyncSource, ray_backend.RaySource) have the same verbs; the loop does not know which
one it drives. `next_index` is the data position to checkpoint: the batch after the last consumed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bebop.rl.records import RolloutBatch
from bebop.rl.sampler import RolloutSampler


@dataclass
class Fetched:
    batch: RolloutBatch
    dropped: int  # batches discarded as too stale before this one
    wait_s: float  # trainer seconds spent waiting


class SyncSource:
    def __init__(self, sampler: RolloutSampler, model, *, start_index: int, policy_version: int = 0,
                 max_staleness: int = 0) -> None:
        self.sampler, self.model, self.next_index = sampler, model, start_index

    def next_batch(self, trainer_version: int) -> Fetched:
        t0 = time.perf_counter()
        batch = self.sampler.collect(self.model, index=self.next_index, policy_version=trainer_version)
        self.next_index += 1
        return Fetched(batch, 0, time.perf_counter() - t0)

    def publish(self, model, version: int) -> None:
        """Rollouts use the trainer's own weights: nothing to sync."""

    def suspend_drafting(self, suspended: bool) -> None:
        self.sampler.drafting_suspended = suspended

    def close(self) -> None:
        pass
