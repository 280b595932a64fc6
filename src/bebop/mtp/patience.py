"""Early stopping for MTP training: keep the head with the best held-out expected acceptance, stop after
`patience` measures without an improvement of at least MIN_DELTA (a tenth of a point: below one standard
error of the exact measure on a few thousand positions, so noise does not restart the count).

    watch = Patience(patience=3)
    if watch.update(value, step, model): ...   # True: stop now
    watch.restore_best(model)                   # the best head's weights back in the model
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from bebop.model.mtp import MTP_PREFIX
from bebop.train_state import master_weights, restore_master_weights

MIN_DELTA = 1e-3


@dataclass
class Patience:
    patience: int  # 0: never stop early (the best head is still kept)
    best: float = -math.inf
    best_step: int = 0
    bad: int = 0  # measures since the last improvement
    best_head: dict[str, torch.Tensor] | None = field(default=None, repr=False)

    def update(self, value: float, step: int, model: torch.nn.Module | None) -> bool:
        """Record the held-out measure at `step`; True when training should stop. `model` None: count only (a
        rank that does not hold the whole model; rank 0 keeps the head)."""
        if value > self.best + MIN_DELTA:
            self.best, self.best_step, self.bad = value, step, 0
            if model is not None:
                self.best_head = master_weights(model, MTP_PREFIX)
        else:
            self.bad += 1
        return self.patience > 0 and self.bad >= self.patience

    def restore_best(self, model: torch.nn.Module) -> None:
        if self.best_head is not None:
            restore_master_weights(model, self.best_head)

    def state(self) -> dict:
        return {"patience": self.patience, "best": self.best, "best_step": self.best_step, "bad": self.bad,
                "best_head": self.best_head}

    @classmethod
    def from_state(cls, state: dict) -> Patience:
        return cls(**state)
