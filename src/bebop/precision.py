"""Training precision: float32, or bfloat16 mixed precision (weights and optimiser state in float32).

    with train_autocast(model.device, cfg.dtype):
        loss = ...            # matmuls in bfloat16 under "bfloat16"; nothing changes under "float32"
    loss.backward()           # gradients land in the float32 weights; AdamW keeps float32 state

Autocast, not bfloat16 weights: the optimiser updates float32 masters, so small updates are not
rounded away (a bf16 weight cannot move by less than 1/256 of itself), and a saved model is written
in its own declared dtype either way (bebop.model.checkpoint.save_model).
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch

from bebop.errors import BebopError

TRAIN_DTYPES = ("float32", "bfloat16")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # what a model may be loaded or sampled in


def check_train_dtype(name: str) -> str:
    if name not in TRAIN_DTYPES:
        raise BebopError(f"unknown training dtype {name!r}; choose from {', '.join(TRAIN_DTYPES)}")
    return name


def train_autocast(device: torch.device, dtype: str) -> ContextManager:
    """The context a training forward runs in for `dtype` (float32: none)."""
    if check_train_dtype(dtype) == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
