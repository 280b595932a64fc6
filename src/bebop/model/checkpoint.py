"""Checkpoint I/O for Hugging Face model directories: a model's tensors under the family's names.

A directory holds `config.json` and either `model.safetensors` or shards listed by
`model.safetensors.index.json` (bebop.model.weight_files: read, and replaced as one step).
`mtp.*` tensors (the MTP draft head) live in the same files (Hugging Face's `from_pretrained`
silently drops them, so bebop reads and writes them itself); `mtp_num_hidden_layers` in
config.json says how many MTP layers there are (inferred from the tensors when absent).

A save keeps what it does not change (`StoredLayout`, recorded by load_model): every tensor is written
in the dtype it was stored in (a new one, such as a fresh head, in the dtype config.json declares),
tensors bebop does not model (a multimodal checkpoint's vision tower) are carried through byte for
byte, the config keeps its keys, and the sharding is kept.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import torch

from bebop.errors import BebopError
from bebop.model.config import ModelConfig, read_config, write_config
from bebop.model.mtp import MTP_PREFIX
from bebop.model.qwen3 import CausalLM
from bebop.model.weight_files import StoredLayout, largest_shard, read_state_dict, write_weights
from bebop.tokenizer import copy_tokenizer_files

LANGUAGE_PREFIX = "model.language_model."  # a multimodal Qwen3.5 checkpoint's text model
VISION_PREFIX = "model.visual."  # its vision tower: not run (bebop runs the text model), carried through saves
__all__ = ["load_model", "read_state_dict", "release_dtype", "save_model"]


def file_name(name: str, cfg: ModelConfig) -> str:
    """A text model's tensor name as the files store it: model.X -> model.language_model.X when the
    checkpoint is a multimodal wrapper (lm_head and mtp.* stay)."""
    return LANGUAGE_PREFIX + name.removeprefix("model.") if cfg.outer and name.startswith("model.") else name


def text_model_names(found: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The inverse of file_name over a file's tensors (names outside the text model are left out)."""
    if not cfg.outer:
        return dict(found)
    out = {}
    for name, tensor in found.items():
        if name.startswith(LANGUAGE_PREFIX):
            out["model." + name.removeprefix(LANGUAGE_PREFIX)] = tensor
        elif not name.startswith("model."):
            out[name] = tensor
    return out


def _carried(raw: dict[str, torch.Tensor], used: set[str], model_dir: Path) -> dict[str, torch.Tensor]:
    """The file's tensors the model does not use, to write back unchanged; unknown mtp.* ones are dropped
    (the head is bebop's to write: a stale layer beside a new head would be read as part of it)."""
    unused = {name: t for name, t in raw.items() if name not in used}
    stale = sorted(name for name in unused if name.startswith(MTP_PREFIX))
    if stale:
        print(f"warning: ignoring {len(stale)} mtp tensor(s) the head does not have in {model_dir}, "
              f"e.g. {stale[0]!r}", file=sys.stderr)
    carried = {name: t for name, t in unused.items() if not name.startswith(MTP_PREFIX)}
    vision = sum(name.startswith(VISION_PREFIX) for name in carried)
    if vision:
        print(f"note: {model_dir} holds a vision tower ({vision} tensors); bebop runs the text model and "
              "writes the tower back unchanged", file=sys.stderr)
    other = sorted(name for name in carried if not name.startswith(VISION_PREFIX))
    if other:
        print(f"note: {len(other)} tensor(s) in {model_dir} that bebop does not use (e.g. {other[0]!r}) are "
              "kept unchanged", file=sys.stderr)
    return carried


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


def checked_state(skeleton: CausalLM, expected: dict[str, torch.Tensor], model_dir: Path,
                  found: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """`found` (Hugging Face names) checked against `expected`, every tensor `skeleton` needs (names, shapes:
    _expected_hf_tensors), cast to `dtype` -> a state dict in bebop's names. Tensors it does not need are not read."""
    state = _check_and_cast(expected, found, model_dir, dtype)
    fused = [k for k in skeleton.state_dict() if _split_name(k)]
    return from_hf_state(state, fused, skeleton.config)


def _mtp_layers_in(names) -> int:
    layers = {name.split(".")[2] for name in names if name.startswith(MTP_PREFIX + "layers.")}
    return len(layers)


def load_model(model_dir: str | os.PathLike, *, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> CausalLM:
    """Load a Hugging Face model directory: the trunk, and the MTP head where it has `mtp.*` weights;
    what a save must give back is recorded in `model.stored` (StoredLayout)."""
    model_dir = Path(model_dir)
    cfg = read_config(model_dir)
    raw = read_state_dict(model_dir)  # the files' names and dtypes
    found = text_model_names(raw, cfg)
    has_mtp = any(name.startswith(MTP_PREFIX) for name in found)
    if has_mtp and not cfg.mtp_num_hidden_layers:
        cfg = replace(cfg, mtp_num_hidden_layers=max(1, _mtp_layers_in(found)))
    elif cfg.mtp_num_hidden_layers and not has_mtp:
        raise BebopError(f"config.json in {model_dir} says mtp_num_hidden_layers={cfg.mtp_num_hidden_layers} "
                         "but the checkpoint holds no mtp.* tensors")
    with torch.device("meta"):
        skeleton = CausalLM(cfg)  # names and shapes only
    expected = _expected_hf_tensors(skeleton)
    model = CausalLM.from_state_dict(cfg, checked_state(skeleton, expected, model_dir, found, dtype), strict=False)
    used = {file_name(name, cfg) for name in expected}
    model.stored = StoredLayout({name: t.dtype for name, t in raw.items()}, _carried(raw, used, model_dir),
                                largest_shard(model_dir))
    return model.to(device).eval()


def release_dtype(model: CausalLM) -> torch.dtype:
    """The dtype a saved model's weights are written in: the one its config.json declares (a
    bfloat16 checkpoint comes back bfloat16, as the engines that load it expect), else the model's."""
    declared = model.config.declared_dtype
    value = getattr(torch, declared, None) if declared else None
    return value if isinstance(value, torch.dtype) and value.is_floating_point else model.dtype


def save_model(model: CausalLM, model_dir: str | os.PathLike, *, max_shard_bytes: int | None = None,
               with_head: bool = True) -> None:
    """Write the weights, then config.json; `mtp.*` tensors of the model (if any) are saved too, unless
    `with_head` is False (the trunk alone, its config without MTP layers: for a loader that refuses a dense
    Qwen3's head, vLLM's). The
    input's layout is kept (model.stored): the family's names (nested for a multimodal Qwen3.5), each
    tensor's stored dtype (a tensor the input did not have: `release_dtype`; trainers keep float32 masters
    for resuming, train_state.master_weights), the tensors bebop does not model, unchanged, and the
    sharding (shards up to the size of the largest input shard) unless `max_shard_bytes` is given.
    The directory's weights are replaced as one step (weight_files.write_weights)."""
    stored = model.stored
    cfg = model.config if with_head else replace(model.config, mtp_num_hidden_layers=0)
    default = release_dtype(model)
    files = {name: t.to(stored.dtypes.get(name, default)) if t.is_floating_point() else t
             for name, t in file_tensors(model, with_head).items()}
    carried = {name: t for name, t in stored.carried.items() if name not in files}
    write_weights(files | carried, model_dir,
                  max_shard_bytes if max_shard_bytes is not None else stored.shard_bytes)
    write_config(cfg, model_dir)


def file_tensors(model: CausalLM, with_head: bool = True) -> dict[str, torch.Tensor]:
    """The model's tensors under the names its files store them by (fused projections split, a tied LM head left
    out, `mtp.*` only `with_head`), in the model's dtype: views of its parameters where the layout allows."""
    state = dict(model.state_dict())
    if not with_head:
        state = {name: t for name, t in state.items() if not name.startswith(MTP_PREFIX)}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return {file_name(name, model.config): t for name, t in to_hf_state(state, model.config).items()}


def write_model_dir(model: CausalLM, source_dir: Path, model_dir: Path, with_head: bool = True) -> None:
    """A loadable model directory: weights (trunk + mtp.*, or the trunk alone), config, the source's tokenizer files."""
    save_model(model, model_dir, with_head=with_head)
    copy_tokenizer_files(source_dir, model_dir)


def build_model(cfg: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float32) -> CausalLM:
    """A freshly initialised model (the embedded default starts here)."""
    model = CausalLM(cfg)
    model.init_weights(torch.Generator().manual_seed(seed))
    return model.to(dtype)
