"""A policy = model + tokenizer from one model directory, checked against each other."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from bebop.errors import BebopError
from bebop.model.checkpoint import load_model
from bebop.model.qwen3 import CausalLM
from bebop.tokenizer import TextCodec, load_tokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class Policy:
    model: CausalLM
    codec: TextCodec

    @property
    def stop_ids(self) -> tuple[int, ...]:
        ids = set(self.model.config.stop_token_ids)
        if self.codec.eos_id is not None:
            ids.add(self.codec.eos_id)
        return tuple(sorted(ids))

    @property
    def pad_id(self) -> int:
        return self.codec.pad_id if self.codec.pad_id is not None else 0


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise BebopError(f"device {name!r} requested but CUDA is not available")
    return torch.device(name)


def load_policy(model_dir: str | os.PathLike, *, dtype: str = "float32", device: str = "auto") -> Policy:
    if dtype not in DTYPES:
        raise BebopError(f"unknown dtype {dtype!r} (choose from {', '.join(DTYPES)})")
    model = load_model(model_dir, dtype=DTYPES[dtype], device=resolve_device(device))
    codec = load_tokenizer(model_dir, eos_id=(model.config.stop_token_ids or (None,))[0])
    if codec.vocab_size > model.config.vocab_size:
        raise BebopError(f"tokenizer has {codec.vocab_size} tokens but the model's vocab_size is "
                         f"{model.config.vocab_size} (vocab mismatch)")
    return Policy(model=model, codec=codec)
