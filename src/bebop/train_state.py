"""Resumable training state next to a model directory: optimizer, step, random states.

`save_train_state` writes `train_state.pt` atomically; the model weights are saved first by the
caller, so a crash between the two resumes from the older state with newer weights at worst
one save interval apart -- never from a half-written file.

A state file is data: tensors and plain values only (random states as tensors, lists and numbers),
read with `torch.load(weights_only=True)`, so a run directory someone hands you cannot run code on
`--resume`. A state written before this rule (numpy's random state as an array) is still read; a file
that needs any other object is refused with one line naming what it holds.
"""

from __future__ import annotations

import os
import random
import zipfile
from pathlib import Path

import numpy as np
import torch

from bebop.errors import BebopError
from bebop.fields import flat_dict
from bebop.fileio import atomic_write

STATE_FILE = "train_state.pt"


# what a state file written before the rule holds beyond plain data: numpy's random state, an array
LEGACY_NUMPY = ("numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct", "numpy.ndarray",
                "numpy.dtype", "numpy.dtypes.UInt32DType")


def rng_state() -> dict:
    """Python's, numpy's and torch's global random states, as plain data (tensors, lists, numbers)."""
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    numpy_state = {"name": name, "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                   "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    return {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}


def config_diff(saved: dict, current: dict) -> list[str]:
    """The keys whose values differ between two configs (a key missing on one side differs), sorted."""
    return sorted(k for k in set(saved) | set(current) if saved.get(k) != current.get(k))


def with_defaults(config_class, saved: dict) -> dict:
    """A saved config with every field added since it was written at its default (what runs did before
    the field existed), so that an older run resumes."""
    return {**flat_dict(config_class()), **saved}


def check_same_config(saved: dict, current: dict, run_dir: str | os.PathLike) -> None:
    """Refuse to resume `run_dir` with another config, naming the fields that differ."""
    diff = config_diff(saved, current)
    if diff:
        raise BebopError(f"cannot resume {run_dir}: config differs in {', '.join(diff)}")


def set_rng_state(state: dict) -> None:
    random.setstate(_as_tuples(state["python"]))
    saved = state["numpy"]
    if isinstance(saved, dict):
        saved = (saved["name"], saved["keys"].numpy().astype(np.uint32), saved["pos"], saved["has_gauss"],
                 saved["cached_gaussian"])
    np.random.set_state(saved)  # a legacy state: numpy's own tuple
    torch.set_rng_state(state["torch"])


def _as_tuples(value):
    """random.setstate wants the tuples it gave (a state may come back with lists)."""
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def save_train_state(directory: str | os.PathLike, state: dict, name: str = STATE_FILE) -> None:
    atomic_write(Path(directory) / name, lambda tmp: torch.save(state, tmp))


def load_train_state(directory: str | os.PathLike, name: str = STATE_FILE, *,
                     map_location: str | None = None) -> dict:
    """The saved state; `map_location="cpu"` loads tensors saved on a GPU onto the CPU (to resume elsewhere)."""
    path = Path(directory) / name
    if not path.is_file():
        raise BebopError(f"nothing to resume: no {name} in {directory}")
    try:
        needs = set(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    except Exception as exc:  # a truncated or foreign file
        raise BebopError(f"corrupt training state {path}: {_unreadable(path, exc)}") from None
    if not needs <= set(LEGACY_NUMPY):
        raise BebopError(f"refusing to load {path}: it holds objects that are not plain data "
                         f"({', '.join(sorted(needs - set(LEGACY_NUMPY)))}); a state bebop writes holds tensors and "
                         "plain values only, and loading anything else could run code")
    try:
        with torch.serialization.safe_globals(_legacy_numpy_globals()):
            return torch.load(path, weights_only=True, map_location=map_location)
    except Exception as exc:  # a truncated file, or a pickle that still asks for more
        raise BebopError(f"corrupt training state {path}: {type(exc).__name__}: {str(exc)[:200]}") from None


def _unreadable(path: Path, exc: Exception) -> str:
    """What is wrong with a state file torch cannot open, in words a user can act on."""
    data = path.read_bytes()
    if not data:
        return "the file is empty"
    if not data.startswith(b"PK\x03\x04"):
        return f"not a torch checkpoint (torch.save writes a zip archive; this file begins {data[:16]!r})"
    if not zipfile.is_zipfile(path):
        return f"a zip archive cut short at {len(data)} bytes (an interrupted write or copy)"
    return f"a zip archive torch cannot read ({type(exc).__name__}: {str(exc)[:160]})"


def _legacy_numpy_globals() -> list:
    """The numpy objects of a numpy random state (an array of a dtype): data, allowed in legacy files."""
    core = getattr(np, "_core", None) or np.core  # numpy 2 / numpy 1
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def master_weights(model: torch.nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """Exact copies of the parameters whose names start with `prefix`: what a resume restores when
    the saved model directory holds them rounded (a bfloat16-declared checkpoint, release_dtype)."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if name.startswith(prefix)}


def restore_master_weights(model: torch.nn.Module, masters: dict[str, torch.Tensor]) -> None:
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in masters.items():
            params[name].copy_(tensor)
