"""What every layer of one forward call shares (the trunk's and the MTP head's)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bebop.model.kv_cache import KVCache
from bebop.model.packing import Packing


@dataclass
class AttentionContext:
    """Rotary tables, positions, mask and cache of one forward call over a chunk of T new tokens."""

    cos: torch.Tensor  # (B, 1, T, Dr): Dr = the rotary dimension (head_dim unless partial)
    sin: torch.Tensor  # (B, 1, T, Dr)
    positions: torch.Tensor  # (B, T) absolute positions of the new tokens
    mask: torch.Tensor | None  # (B, 1, T, S) bool, True = attend; None = plain causal, no cache
    cache: KVCache | None  # a HybridCache (model/hybrid_cache.py) also holds the linear layers' states
    num_new: torch.Tensor | None = None  # (B,) tokens each row keeps of the chunk (None: all)
    packing: Packing | None = None  # a packed training sequence (B = 1): attention per segment (model/packing.py)
