"""What every rollout source shares: the interface the RL loop drives, and the pieces each
implementation needs (the staleness rule, weight snapshots and their strict load).

    source = make_source(...)                      # loop.py: SyncSource, AsyncSource or RaySource
    fetched = source.next_batch(trainer_version)   # -> Fetched(batch, dropped, wait_s)
    source.publish(model, version)                 # after each update: trunk AND head
    source.suspend_drafting(True)                  # the drafter alarm: batches sampled from now on
    source.close()

`next_index` is the data position to checkpoint: the batch after the last one consumed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from bebop.errors import BebopError
from bebop.model.mtp import MTP_PREFIX

if TYPE_CHECKING:
    from bebop.model.qwen3 import CausalLM
    from bebop.rl.records import RolloutBatch


@dataclass
class Fetched:
    batch: RolloutBatch
    dropped: int  # batches discarded as too stale before this one
    wait_s: float  # trainer seconds spent waiting


class RolloutSource(Protocol):
    next_index: int

    def next_batch(self, trainer_version: int) -> Fetched: ...

    def publish(self, model: CausalLM, version: int) -> None: ...

    def suspend_drafting(self, suspended: bool) -> None: ...

    def close(self) -> None: ...


def is_fresh(batch_version: int, trainer_version: int, max_staleness: int) -> bool:
    return trainer_version - batch_version <= max_staleness


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of the full state dict (trunk and mtp.*)."""
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def sync_weights(engine: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load every tensor of `state` into the engine model; both must hold the same names (head included)."""
    engine_has_head = any(k.startswith(MTP_PREFIX) for k in engine.state_dict())
    if engine_has_head and not any(k.startswith(MTP_PREFIX) for k in state):
        raise BebopError("weight sync carries no mtp.* tensors but the rollout engine drafts with a head")
    engine.load_state_dict(state, strict=True)
