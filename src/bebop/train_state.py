"""Resumable training state next to a model directory: optimizer, step, random states.

`save_train_state` writes `train_state.pt` atomically; the model weights are saved first by the
caller, so a crash between the two resumes from the older state with newer weights at worst
one save interval apart -- never from a half-written file.
"""

from __future__ import annotations

import dataclasses
import os
import random
from pathlib import Path

import numpy as np
import torch

from bebop.errors import BebopError
from bebop.fileio import atomic_write

STATE_FILE = "train_state.pt"


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def config_diff(saved: dict, current: dict) -> list[str]:
    """The keys whose values differ between two configs (a key missing on one side differs), sorted."""
    return sorted(k for k in set(saved) | set(current) if saved.get(k) != current.get(k))


def with_defaults(config_class, saved: dict) -> dict:
    """A saved config with every field added since it was written at its default (what runs did before
    the field existed), so that an older run resumes."""
    return {**dataclasses.asdict(config_class()), **saved}


def check_same_config(saved: dict, current: dict, run_dir: str | os.PathLike) -> None:
    """Refuse to resume `run_dir` with another config, naming the fields that differ."""
    diff = config_diff(saved, current)
    if diff:
        raise BebopError(f"cannot resume {run_dir}: config differs in {', '.join(diff)}")


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_train_state(directory: str | os.PathLike, state: dict, name: str = STATE_FILE) -> None:
    atomic_write(Path(directory) / name, lambda tmp: torch.save(state, tmp))


def load_train_state(directory: str | os.PathLike, name: str = STATE_FILE, *,
                     map_location: str | None = None) -> dict:
    """The saved state; `map_location="cpu"` loads tensors saved on a GPU onto the CPU (to resume elsewhere)."""
    path = Path(directory) / name
    if not path.is_file():
        raise BebopError(f"nothing to resume: no {name} in {directory}")
    try:
        return torch.load(path, weights_only=False, map_location=map_location)
    except Exception as exc:  # a truncated or foreign file
        raise BebopError(f"corrupt training state {path}: {type(exc).__name__}") from None


def master_weights(model: torch.nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """Exact copies of the parameters whose names start with `prefix`: what a resume restores when
    the saved model directory holds them rounded (a bfloat16-declared checkpoint, release_dtype)."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if name.startswith(prefix)}


def restore_master_weights(model: torch.nn.Module, masters: dict[str, torch.Tensor]) -> None:
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in masters.items():
            params[name].copy_(tensor)
