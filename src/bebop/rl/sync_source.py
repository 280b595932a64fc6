"""The sync rollout source: each batch is generated now, with the trainer's own weights."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from bebop.rl.source import Fetched

if TYPE_CHECKING:
    from bebop.model.qwen3 import CausalLM
    from bebop.rl.sampler import RolloutSampler


class SyncSource:
    def __init__(self, sampler: RolloutSampler, model: CausalLM, *, start_index: int, policy_version: int = 0,
                 max_staleness: int = 0) -> None:
        self.sampler, self.model, self.next_index = sampler, model, start_index

    def next_batch(self, trainer_version: int) -> Fetched:
        t0 = time.perf_counter()
        batch = self.sampler.collect(self.model, index=self.next_index, policy_version=trainer_version)
        self.next_index += 1
        return Fetched(batch, 0, time.perf_counter() - t0)

    def publish(self, model: CausalLM, version: int) -> None:
        """Rollouts use the trainer's own weights: nothing to sync."""

    def suspend_drafting(self, suspended: bool) -> None:
        self.sampler.drafting_suspended = suspended

    def close(self) -> None:
        pass
