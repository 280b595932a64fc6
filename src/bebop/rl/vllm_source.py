"""The sync rollout source on vLLM (`--engine vllm`): each batch is sampled now by a vLLM worker serving the
trainer's weights, which `publish` writes and reloads after every update (trunk and head: the drafter drafts
with the head just trained, never a stale one)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bebop.rl.sync_source import SyncSource

if TYPE_CHECKING:
    from bebop.model.qwen3 import CausalLM
    from bebop.rl.sampler import RolloutSampler
    from bebop.vllm.serve import VllmServer


class VllmSource(SyncSource):
    def __init__(self, sampler: RolloutSampler, model: CausalLM, server: VllmServer, *, start_index: int,
                 policy_version: int = 0, max_staleness: int = 0) -> None:
        super().__init__(sampler, model, start_index=start_index)
        self.server = server
        sampler.vllm = server

    def publish(self, model: CausalLM, version: int) -> None:
        self.server.sync(model)

    def close(self) -> None:
        self.sampler.vllm = None
        self.server.close()
