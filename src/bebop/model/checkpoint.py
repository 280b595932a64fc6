"""Checkpoint I/O for Hugging Face model directories.

A directory holds `config.json` and either `model.safetensors` or shards listed by
`model.safetensors.index.json`. Every file is written atomically (temp file + rename); the index
is written last, so an interrupted save never leaves an index pointing at half-written shards.
`mtp.*` tensors (the MTP draft head) live in the same files (Hugging Face's `from_pretrained`
silently drops them, so bebop reads and writes them itself); `mtp_num_hidden_layers` in
config.json says how many MTP layers there are (inferred from the tensors when absent).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from bebop.errors import BebopError
from bebop.fileio import atomic_write, atomic_write_json
from bebop.model.config import ModelConfig, read_config, write_config
from bebop.model.mtp import MTP_PREFIX
from bebop.model.qwen3 import CausalLM

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
LANGUAGE_PREFIX = "model.language_model."  # a multimodal Qwen3.5 checkpoint's text model
VISION_PREFIX = "model.visual."  # its vision tower: not loaded (bebop runs the text model)


def text_model_names(found: dict[str, torch.Tensor], model_dir: Path) -> dict[str, torch.Tensor]:
    """A multimodal checkpoint's tensors under the text model's own names (model.language_model.X ->
    model.X; lm_head and mtp.* stay), the vision tower left out with a note."""
    vision = [name for name in found if name.startswith(VISION_PREFIX)]
    if vision:
        print(f"note: {model_dir} holds a vision tower ({len(vision)} tensors); bebop loads the text model only",
              file=sys.stderr)
    return {("model." + name.removeprefix(LANGUAGE_PREFIX) if name.startswith(LANGUAGE_PREFIX) else name): tensor
            for name, tensor in found.items() if not name.startswith(VISION_PREFIX)}


def nested_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of text_model_names for saving: model.X -> model.language_model.X."""
    return {(LANGUAGE_PREFIX + name.removeprefix("model.") if name.startswith("model.") else name): tensor
            for name, tensor in state.items()}


def _weight_files(model_dir: Path) -> dict[str, list[str]]:
    """file name -> tensor names it holds (from the index, or the single file)."""
    index_path = model_dir / INDEX_FILE
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise BebopError(f"{index_path} is malformed: {exc}") from None
        files: dict[str, list[str]] = {}
        for name, file in weight_map.items():
            files.setdefault(file, []).append(name)
        return files
    if (model_dir / SINGLE_FILE).is_file():
        return {SINGLE_FILE: []}  # names read from the file itself
    raise BebopError(f"no {SINGLE_FILE} or {INDEX_FILE} in {model_dir}")


def read_state_dict(model_dir: str | os.PathLike, keep=lambda name: True) -> dict[str, torch.Tensor]:
    """All tensors whose name passes `keep`, from single or sharded safetensors files."""
    model_dir = Path(model_dir)
    state: dict[str, torch.Tensor] = {}
    for file, _ in _weight_files(model_dir).items():
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


def write_state_dict(state: dict[str, torch.Tensor], model_dir: str | os.PathLike,
                     max_shard_bytes: int | None = None) -> None:
    """Write tensors as one file, or shards plus an index when larger than max_shard_bytes."""
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if max_shard_bytes and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    stale = [model_dir / SINGLE_FILE, model_dir / INDEX_FILE]
    if len(shards) == 1:
        atomic_write(model_dir / SINGLE_FILE, lambda tmp: save_file(shards[0], tmp, metadata={"format": "pt"}))
        _remove_old_shards(model_dir, keep={SINGLE_FILE})
        stale[1].unlink(missing_ok=True)
        return
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for name, shard in zip(names, shards):
        atomic_write(model_dir / name, partial(save_file, shard, metadata={"format": "pt"}))  # (tmp) -> save_file(shard, tmp)
    weight_map = {tensor: name for name, shard in zip(names, shards) for tensor in shard}
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    atomic_write_json(model_dir / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map})
    stale[0].unlink(missing_ok=True)
    _remove_old_shards(model_dir, keep=set(names))


def _remove_old_shards(model_dir: Path, keep: set[str]) -> None:
    for path in model_dir.glob("model-*-of-*.safetensors"):
        if path.name not in keep:
            path.unlink()


def _check_and_cast(expected: dict[str, torch.Tensor], found: dict[str, torch.Tensor], where: Path,
                    dtype: torch.dtype) -> dict[str, torch.Tensor]:
    out = {}
    for name, param in expected.items():
        if name not in found:
            raise BebopError(f"checkpoint {where} is missing tensor {name!r} (expected shape {tuple(param.shape)})")
        tensor = found[name]
        if tuple(tensor.shape) != tuple(param.shape):
            raise BebopError(f"checkpoint {where}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                             f"the config implies {tuple(param.shape)}")
        out[name] = tensor.to(dtype)
    return out


def _fused_parts(cfg: ModelConfig) -> dict[str, list[tuple[str, int]]]:
    """fused module name -> [(Hugging Face module name, rows)] stacked along dim 0."""
    q = cfg.num_attention_heads * cfg.head_dim * (2 if cfg.attn_output_gate else 1)  # Qwen3.5: query and gate
    kv = cfg.num_key_value_heads * cfg.head_dim
    return {"qkv_proj": [("q_proj", q), ("k_proj", kv), ("v_proj", kv)],
            "gate_up_proj": [("gate_proj", 0), ("up_proj", 0)]}  # 0: halves (MLP, experts, shared expert alike)


def _split_name(name: str) -> tuple[str, str, str] | None:
    """'a.b.qkv_proj.weight' -> ('a.b.', 'qkv_proj', '.weight') for fused names, else None."""
    parts = name.rsplit(".", 2)
    if len(parts) == 3 and parts[1] in ("qkv_proj", "gate_up_proj"):
        return parts[0] + ".", parts[1], "." + parts[2]
    return None


def to_hf_state(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our names -> Hugging Face names: fused projections split into their parts."""
    out = {}
    table = _fused_parts(cfg)
    for name, tensor in state.items():
        split = _split_name(name)
        if split is None:
            out[name] = tensor
            continue
        prefix, fused, suffix = split
        sizes = [rows or tensor.shape[0] // len(table[fused]) for _, rows in table[fused]]
        pieces = tensor.split(sizes, dim=0)
        for (part, _), piece in zip(table[fused], pieces):
            out[prefix + part + suffix] = piece
    return out


def from_hf_state(state: dict[str, torch.Tensor], fused_names: list[str], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Hugging Face names -> ours: stack the parts of each fused projection (parts are consumed)."""
    out = dict(state)
    table = _fused_parts(cfg)
    for name in fused_names:
        split = _split_name(name)
        assert split is not None  # fused_names are the names _split_name splits
        prefix, fused, suffix = split
        out[name] = torch.cat([out.pop(prefix + part + suffix) for part, _ in table[fused]], dim=0)
    return out


def _expected_hf_tensors(model: CausalLM) -> dict[str, torch.Tensor]:
    """Hugging Face name -> tensor (for its shape) of every tensor the checkpoint must hold."""
    names = dict(model.state_dict())
    if model.config.tie_word_embeddings:
        names.pop("lm_head.weight", None)
    return to_hf_state(names, model.config)


def checked_state(skeleton: CausalLM, model_dir: Path, found: dict[str, torch.Tensor],
                  dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """`found` (Hugging Face names) checked against every tensor `skeleton` needs (names, shapes;
    unknown ones warned about and dropped), cast to `dtype` -> a state dict in bebop's names."""
    expected = _expected_hf_tensors(skeleton)
    unexpected = sorted(set(found) - set(expected))
    if unexpected:
        print(f"warning: ignoring {len(unexpected)} unknown tensor(s) in {model_dir}, e.g. {unexpected[0]!r}",
              file=sys.stderr)
    state = _check_and_cast(expected, found, model_dir, dtype)
    fused = [k for k in skeleton.state_dict() if _split_name(k)]
    return from_hf_state(state, fused, skeleton.config)


def _mtp_layers_in(names) -> int:
    layers = {name.split(".")[2] for name in names if name.startswith(MTP_PREFIX + "layers.")}
    return len(layers)


def load_model(model_dir: str | os.PathLike, *, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> CausalLM:
    """Load a Hugging Face model directory: the trunk, and the MTP head where it has `mtp.*` weights."""
    model_dir = Path(model_dir)
    cfg = read_config(model_dir)
    found = read_state_dict(model_dir)
    if cfg.outer:
        found = text_model_names(found, model_dir)
    if cfg.tie_word_embeddings:
        found.pop("lm_head.weight", None)
    has_mtp = any(name.startswith(MTP_PREFIX) for name in found)
    if has_mtp and not cfg.mtp_num_hidden_layers:
        cfg = replace(cfg, mtp_num_hidden_layers=max(1, _mtp_layers_in(found)))
    elif cfg.mtp_num_hidden_layers and not has_mtp:
        raise BebopError(f"config.json in {model_dir} says mtp_num_hidden_layers={cfg.mtp_num_hidden_layers} "
                         "but the checkpoint holds no mtp.* tensors")
    with torch.device("meta"):
        skeleton = CausalLM(cfg)  # names and shapes only
    model = CausalLM.from_state_dict(cfg, checked_state(skeleton, model_dir, found, dtype), strict=False)
    model.shard_bytes = _largest_shard(model_dir)
    return model.to(device).eval()


def _largest_shard(model_dir: Path) -> int | None:
    """The largest shard's size of a sharded checkpoint (saving it back shards it alike), else None."""
    files = _weight_files(model_dir)
    if len(files) < 2:
        return None
    return max((model_dir / name).stat().st_size for name in files)


def release_dtype(model: CausalLM) -> torch.dtype:
    """The dtype a saved model's weights are written in: the one its config.json declares (a
    bfloat16 checkpoint comes back bfloat16, as the engines that load it expect), else the model's."""
    declared = model.config.declared_dtype
    value = getattr(torch, declared, None) if declared else None
    return value if isinstance(value, torch.dtype) and value.is_floating_point else model.dtype


def save_model(model: CausalLM, model_dir: str | os.PathLike, *, max_shard_bytes: int | None = None) -> None:
    """Write config.json and the weights; `mtp.*` tensors of the model (if any) are saved too. The
    input's layout is kept: the family's names (nested for a multimodal Qwen3.5), the dtype its config
    declares (`release_dtype`; trainers keep float32 masters for resuming, train_state.master_weights),
    and its sharding (shards up to the size of the largest input shard) unless `max_shard_bytes` is given."""
    model_dir = Path(model_dir)
    dtype = release_dtype(model)
    state = {name: t.to(dtype) if t.is_floating_point() else t for name, t in model.state_dict().items()}
    max_shard_bytes = max_shard_bytes if max_shard_bytes is not None else model.shard_bytes
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    state = to_hf_state(state, model.config)
    write_state_dict(nested_names(state) if model.config.outer else state, model_dir, max_shard_bytes)
    write_config(model.config, model_dir)


def build_model(cfg: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float32) -> CausalLM:
    """A freshly initialised model (the embedded default starts here)."""
    model = CausalLM(cfg)
    model.init_weights(torch.Generator().manual_seed(seed))
    return model.to(dtype)
