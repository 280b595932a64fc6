"""The embedded default: a small Qwen3-architecture model with a character-level tokenizer.

Everything bebop shows on a CPU starts from here, since nothing can be downloaded:
`init_model_dir(out)` writes a freshly initialised model directory (config.json,
model.safetensors, tokenizer.json) that every command loads like any Hugging Face checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from bebop.model.checkpoint import build_model, save_model
from bebop.model.config import ModelConfig
from bebop.tokenizer import build_char_tokenizer, codec_from_tokenizer, save_tokenizer


def default_config(vocab_size: int, eos_id: int | None, pad_id: int | None, **overrides) -> ModelConfig:
    """About 2.4M parameters: 12 layers, hidden 128, GQA 4 query / 2 KV heads, context 512.

    Deep and narrow on purpose: real MTP models put one MTP layer on 28-94 trunk layers, so a
    draft step is a few percent of a trunk step. Here the one MTP layer against 12 trunk layers
    keeps K=3 drafting near a third of a trunk forward (docs/benchmarks.md), where the earlier
    4-layer default made it cost about 0.9 of one and speculation could not pay."""
    fields: dict[str, Any] = dict(vocab_size=vocab_size, hidden_size=128, intermediate_size=384, num_hidden_layers=12,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                                  rope_theta=10000.0, tie_word_embeddings=True, eos_token_id=eos_id, pad_token_id=pad_id)
    fields.update(overrides)
    return ModelConfig(**fields)


def init_model_dir(out: str | os.PathLike, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                   **overrides) -> Path:
    """Write a randomly initialised embedded-default model directory and return its path."""
    out = Path(out)
    tok = build_char_tokenizer()
    codec = codec_from_tokenizer(tok)
    cfg = default_config(codec.vocab_size, codec.eos_id, codec.pad_id, **overrides)
    save_model(build_model(cfg, seed=seed, dtype=dtype), out)
    save_tokenizer(tok, out)
    return out
