"""The Qwen3 dense causal LM (trunk + LM head), Hugging Face weight names.

    model = CausalLM(config)
    hidden = model(input_ids, cache, num_new)   # (B, T, H): last hidden states, BEFORE the final norm
    logits = model.logits(hidden)               # (B, T, V)

Without a cache, `forward` runs plain causal attention from position 0 (training, scoring).
With a cache, the chunk is appended per row at each row's length (see kv_cache.py).
The pre-norm hidden state is what an MTP head consumes (method.md section 2).
"""

from __future__ import annotations

import torch
from torch import nn

from bebop.errors import BebopError
from bebop.model.config import ModelConfig
from bebop.model.kv_cache import KVCache
from bebop.model.layers import DecoderLayer, RMSNorm, attention_context


class Qwen3Model(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Qwen3Model(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def init_weights(self, generator: torch.Generator | None = None, std: float = 0.02) -> None:
        """Hugging Face's Qwen3 initialisation: N(0, std) for linear and embedding, norms at 1."""
        with torch.no_grad():
            for name, param in self.named_parameters():
                if name.endswith("norm.weight"):
                    param.fill_(1.0)
                elif name.endswith("bias"):
                    param.zero_()
                else:
                    param.normal_(0.0, std, generator=generator)

    def new_cache(self, batch_size: int, capacity: int) -> KVCache:
        cfg = self.config
        return KVCache(cfg.num_hidden_layers, batch_size, cfg.num_key_value_heads, cfg.head_dim,
                       capacity, dtype=self.dtype, device=self.device)

    def forward(self, input_ids: torch.Tensor, cache: KVCache | None = None,
                num_new: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids (B, T) -> hidden (B, T, H) before the final norm.

        With a cache, row b appends its first num_new[b] tokens (default: all T)."""
        b, t = input_ids.shape
        if cache is None:
            positions = torch.arange(t, device=input_ids.device).expand(b, t)  # (B, T)
            if t > self.config.max_position_embeddings:
                raise BebopError(f"sequence of {t} tokens exceeds the context ({self.config.max_position_embeddings})")
        else:
            if cache.batch_size != b:
                raise BebopError(f"batch of {b} rows does not match the cache's {cache.batch_size}")
            positions = cache.positions(t)  # (B, T)
        x = self.model.embed_tokens(input_ids)  # (B, T, H)
        ctx = attention_context(positions, cache, self.config.head_dim, self.config.rope_theta, x.dtype)
        for layer in self.model.layers:
            x = layer(x, ctx)
        if cache is not None:
            if num_new is None:
                num_new = torch.full((b,), t, dtype=torch.long, device=input_ids.device)
            cache.advance(num_new, t)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (..., H) before the final norm -> logits (..., V) in float32."""
        return self.lm_head(self.model.norm(hidden)).float()
