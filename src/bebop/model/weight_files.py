"""The safetensors files of a model directory: read them, and replace them as one step.

A directory holds `model.safetensors`, or shards listed by `model.safetensors.index.json`. Loaders
resolve it alike: the single file when there is one (transformers' order), else the index.

`write_weights` replaces a directory's weights so that an interruption at any file operation leaves
either the old model or the new one, complete, for every loader (transformers and bebop: the single
file first, else the index; vLLM: the files the index names, else every *.safetensors file):
- one file into a directory without an index: written beside the old one and renamed over it;
- otherwise every shard is written under a staged name no file has, the index is switched to them
  (the new model is live), the old weight files are removed, then each shard gets its usual name by a
  hard link, the index is switched to those names (for one file: removed, the staged twin still
  beside it holding the same tensors) and the staged names are removed. A file system without hard
  links keeps the staged names (the index names them). A single file about to become shards is first
  made a one-shard index of itself (_index_the_single_file), so no single file outranks the index.
The folder is fsynced at each switch point (fileio.fsync_dir: every rename at once, every link or
unlink before the rename or the return that relies on it, an unlinked index before the files it
named go), so the order holds after a power loss too, not only by the file system's habit. Staged
twins an earlier crash left are removed before a single file is written: a vLLM that reads every
*.safetensors file must never see the new file beside an old twin.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from bebop.errors import BebopError
from bebop.fileio import atomic_write, atomic_write_json, fsync_dir

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
STAGED_TAG = ".bebop-staged"  # model-00001-of-00003.bebop-staged.safetensors: a shard before its rename
METADATA = {"format": "pt"}


def weight_files(model_dir: Path) -> dict[str, list[str]]:
    """file name -> tensor names it holds (from the index, or [] for the single file: read from it)."""
    if (model_dir / SINGLE_FILE).is_file():
        return {SINGLE_FILE: []}
    index_path = model_dir / INDEX_FILE
    if index_path.is_file():
        files: dict[str, list[str]] = {}
        for name, file in _weight_map(index_path).items():
            files.setdefault(file, []).append(name)
        return files
    raise BebopError(f"no {SINGLE_FILE} or {INDEX_FILE} in {model_dir}")


def _weight_map(index_path: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(index_path.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise BebopError(f"{index_path} is malformed: {exc}") from None
    if not isinstance(weight_map, dict):
        raise BebopError(f"{index_path} is malformed: weight_map is not an object")
    return weight_map


def read_state_dict(model_dir: str | os.PathLike, keep=lambda name: True) -> dict[str, torch.Tensor]:
    """All tensors whose name passes `keep`, from single or sharded safetensors files, as stored."""
    model_dir = Path(model_dir)
    state: dict[str, torch.Tensor] = {}
    for file in weight_files(model_dir):
        path = model_dir / file
        if not path.is_file():
            raise BebopError(f"checkpoint shard missing: {path}")
        try:
            with safe_open(str(path), framework="pt") as fh:
                for name in fh.keys():
                    if keep(name):
                        state[name] = fh.get_tensor(name)
        except (SafetensorError, OSError) as exc:
            raise BebopError(f"corrupt checkpoint file {path}: {exc}") from None
    return state


def largest_shard(model_dir: Path) -> int | None:
    """The largest shard's size of a sharded directory (a save shards alike), else None."""
    files = weight_files(model_dir)
    if SINGLE_FILE in files:
        return None
    return max((model_dir / name).stat().st_size for name in files)


def _split(tensors: dict[str, torch.Tensor], max_shard_bytes: int | None) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if max_shard_bytes and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards


def _save(tensors: dict[str, torch.Tensor], path: str) -> None:
    save_file(tensors, path, metadata=METADATA)


def write_weights(state: dict[str, torch.Tensor], model_dir: str | os.PathLike,
                  max_shard_bytes: int | None = None) -> None:
    """Replace the directory's weights by `state` (names and dtypes as given), as one step (module doc)."""
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    shards = _split(tensors, max_shard_bytes)
    if len(shards) == 1 and not (model_dir / INDEX_FILE).is_file():
        if _remove_staged(model_dir, keep=set()):  # before: the new file beside an old twin would be a mix
            fsync_dir(model_dir)
        atomic_write(model_dir / SINGLE_FILE, partial(_save, shards[0]))
        return
    if (model_dir / SINGLE_FILE).is_file():
        _index_the_single_file(model_dir)
    old = set(_weight_map(model_dir / INDEX_FILE).values()) if (model_dir / INDEX_FILE).is_file() else set()
    one = len(shards) == 1  # a sharded directory becoming one file
    names = [SINGLE_FILE] if one else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                                       for i in range(len(shards))]
    staged = [_staged_name(model_dir, name) for name in names]
    for name, shard in zip(staged, shards):
        atomic_write(model_dir / name, partial(_save, shard))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    contents = [list(shard) for shard in shards]
    _write_index(model_dir, staged, contents, total)  # the new model is live
    for name in old - set(staged):
        (model_dir / name).unlink(missing_ok=True)
    _remove_staged(model_dir, keep=set(staged))
    linked = _link_all(model_dir, staged, names)
    fsync_dir(model_dir)  # the unlinks and links, before the index names the links
    if not linked:
        return  # the staged names stay, named by the index
    if one:  # model.safetensors and its staged twin hold the same tensors: any mix of the two is one model
        (model_dir / INDEX_FILE).unlink()
        fsync_dir(model_dir)  # the index gone before the staged twin it names
    else:
        _write_index(model_dir, names, contents, total)
    for name in staged:
        (model_dir / name).unlink()
    fsync_dir(model_dir)


def _index_the_single_file(model_dir: Path) -> None:
    """The directory's single file as a one-shard index (a second link named by an index, then the single
    file removed): every loader still reads the old model, and no single file outranks the index to come."""
    single = model_dir / SINGLE_FILE
    twin = _staged_name(model_dir, "model-00001-of-00001.safetensors")
    try:
        os.link(single, model_dir / twin)
    except OSError:  # no hard links here: a copy, renamed into place
        atomic_write(model_dir / twin, partial(shutil.copyfile, single))
    else:
        fsync_dir(model_dir)  # the twin on disk before the index names it
    with safe_open(str(single), framework="pt") as fh:
        names = list(fh.keys())
    _write_index(model_dir, [twin], [names], single.stat().st_size)
    single.unlink()
    fsync_dir(model_dir)  # the single file gone before an index it would outrank


def _staged_name(model_dir: Path, name: str) -> str:
    base = name.removesuffix(".safetensors") + STAGED_TAG
    candidate, n = base + ".safetensors", 0
    while (model_dir / candidate).exists():  # a leftover still named by the live index
        n += 1
        candidate = f"{base}{n}.safetensors"
    return candidate


def _write_index(model_dir: Path, files: list[str], contents: list[list[str]], total: int) -> None:
    weight_map = {tensor: file for file, names in zip(files, contents) for tensor in names}
    atomic_write_json(model_dir / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map})


def _link_all(model_dir: Path, staged: list[str], names: list[str]) -> bool:
    """Give each staged shard its usual name as a second link; False (nothing left behind) where the
    file system has no hard links."""
    made = []
    try:
        for src, dst in zip(staged, names):
            (model_dir / dst).unlink(missing_ok=True)  # an unreferenced leftover of that name
            os.link(model_dir / src, model_dir / dst)
            made.append(dst)
    except OSError:
        for dst in made:
            (model_dir / dst).unlink(missing_ok=True)
        return False
    return True


def _remove_staged(model_dir: Path, keep: set[str]) -> bool:
    """Remove the staged shards an interrupted save left that no live index names -> whether there were any."""
    stale = [path for path in model_dir.glob(f"*{STAGED_TAG}*.safetensors") if path.name not in keep]
    for path in stale:
        path.unlink()
    return bool(stale)


@dataclass
class StoredLayout:
    """What a model directory held beyond the tensors bebop runs, kept on the loaded model so that a save
    gives it back: each tensor's dtype as stored, the tensors bebop does not model (a vision tower, an LM
    head stored beside tied embeddings, anything unknown: carried unchanged, byte for byte), the shard size.
    Shared, not copied, by deepcopy (its tensors are never written to)."""

    dtypes: dict[str, torch.dtype] = field(default_factory=dict)  # file's tensor name -> dtype as stored
    carried: dict[str, torch.Tensor] = field(default_factory=dict)  # file's tensor name -> tensor as read
    shard_bytes: int | None = None  # the largest input shard (None: one file)

    def __deepcopy__(self, memo: dict) -> "StoredLayout":
        return self
