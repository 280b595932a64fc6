"""The rollout sources on vLLM (`--engine vllm`): a vLLM worker serving the trainer's weights samples every
batch, and each is reloaded with the weights the batch needs (trunk and head: the drafter drafts with the head
of that version, never a stale one).

    VllmSource        sync: `publish` writes and reloads the weights after every update, the batch is sampled now
    VllmAsyncSource   async: AsyncSource's worker thread loads a published snapshot into its policy copy, reloads
                      vLLM with it, then samples (vLLM generates in its own process while the trainer trains)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bebop.rl.async_loop import AsyncSource
from bebop.rl.sync_source import SyncSource

if TYPE_CHECKING:
    from bebop.model.qwen3 import CausalLM
    from bebop.rl.sampler import RolloutSampler
    from bebop.rl.source import Fetched
    from bebop.vllm.serve import VllmServer


class VllmSource(SyncSource):
    def __init__(self, sampler: RolloutSampler, model: CausalLM, server: VllmServer, *, start_index: int,
                 policy_version: int = 0, max_staleness: int = 0) -> None:
        super().__init__(sampler, model, start_index=start_index)
        self.server = server
        sampler.vllm = server

    def next_batch(self, trainer_version: int) -> Fetched:
        """The batch, sampled now; then vLLM sleeps through the update when it may (--vllm-sleep)."""
        fetched = super().next_batch(trainer_version)
        self.server.suspend()
        return fetched

    def publish(self, model: CausalLM, version: int) -> None:
        self.server.sync(model)  # wakes vLLM first

    def close(self) -> None:
        self.sampler.vllm = None
        self.server.close()


class VllmAsyncSource(AsyncSource):
    """Only the worker thread talks to vLLM (sync and generate), so the pipe has one user."""

    def __init__(self, sampler: RolloutSampler, model: CausalLM, server: VllmServer, *, start_index: int,
                 policy_version: int = 0, max_staleness: int = 1) -> None:
        self.server = server
        sampler.vllm = server  # before the worker thread starts
        super().__init__(sampler, model, start_index=start_index, policy_version=policy_version,
                         max_staleness=max_staleness)

    def _load_latest(self) -> None:
        loaded = self.rollout_version
        super()._load_latest()
        if self.rollout_version != loaded:  # a newer snapshot is in the policy copy: vLLM serves it from now on
            self.server.sync(self.rollout_model)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.sampler.vllm = None
            self.server.close()
