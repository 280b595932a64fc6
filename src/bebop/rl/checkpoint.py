"""Atomic RL checkpoints: RUN_DIR/ckpt-<step>/ (model dir + state.pt) and a LATEST pointer.

    save_checkpoint(run_dir, step, model, source_dir, state)   # state: optimizers, rng, positions
    found = load_checkpoint(run_dir)                           # -> Checkpoint(model_dir, state) | None

A checkpoint is written whole into a temporary directory, renamed to ckpt-<step>, and only then
named by LATEST (itself written atomically). A crash at any moment leaves LATEST pointing at a
complete checkpoint (or at none yet); leftovers are removed by the next save.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bebop.errors import BebopError
from bebop.fileio import atomic_write_text
from bebop.model.checkpoint import write_model_dir
from bebop.model.qwen3 import CausalLM
from bebop.train_state import load_train_state, save_train_state

LATEST = "LATEST"
PREFIX = "ckpt-"
STATE_FILE = "state.pt"
MODEL_DIR = "model"


@dataclass
class Checkpoint:
    path: Path
    state: dict

    @property
    def model_dir(self) -> Path:
        return self.path / MODEL_DIR


def save_checkpoint(run_dir: str | Path, step: int, model: CausalLM, source_dir: str | Path,
                    state: dict) -> Path:
    run_dir = Path(run_dir)
    tmp = Path(tempfile.mkdtemp(dir=run_dir, prefix=".ckpt-tmp-"))
    write_model_dir(model, Path(source_dir), tmp / MODEL_DIR)
    save_train_state(tmp, state, STATE_FILE)
    final = run_dir / f"{PREFIX}{step:06d}"
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    atomic_write_text(run_dir / LATEST, final.name + "\n")
    _remove_others(run_dir, keep=final.name)
    return final


def _remove_others(run_dir: Path, keep: str) -> None:
    for path in run_dir.iterdir():
        if path.is_dir() and path.name != keep and (path.name.startswith(PREFIX) or path.name.startswith(".ckpt-tmp-")):
            shutil.rmtree(path, ignore_errors=True)


def load_checkpoint(run_dir: str | Path) -> Checkpoint | None:
    """The checkpoint LATEST names, or None when the run has none yet."""
    pointer = Path(run_dir) / LATEST
    if not pointer.is_file():
        return None
    path = Path(run_dir) / pointer.read_text().strip()
    if not path.is_dir():
        raise BebopError(f"{pointer} names {path.name}, which is missing (a corrupted run directory)")
    return Checkpoint(path, load_train_state(path, STATE_FILE))
