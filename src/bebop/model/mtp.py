"""The MTP draft head in the Qwen3-Next / Qwen3.5 layout (docs/method.md section 2).

Inputs at position t: the trunk's last hidden state h_t AFTER the trunk's final norm and the
embedding of the token at t+1 (embedding table and LM head shared with the trunk):

    x      = fc(concat[pre_fc_norm_embedding(e), pre_fc_norm_hidden(h_t)])   # 2H -> H, embedding first
    x'     = norm(layers[(depth - 1) % num_layers](x))                        # a trunk decoder layer, own KV cache
    logits = lm_head(x')

Depth d+1 takes depth d's output x' (after `norm`: the very tensor its logits came from) and the
embedding of the token drafted at depth d. These are the semantics vLLM (`qwen3_next_mtp.py`,
`qwen3_5_mtp.py`) and SGLang run, so a head trained here drafts there unchanged.

KV-cache semantics (one cache row per sequence, positions like the trunk's): the entry at
position s is written by the depth-1 input (h_s, e(x_{s+1})) -- the *refresh* after every
verification, run through every MTP layer. With several layers, a depth sees only the chain
entries its own layer wrote. Drafting depth d >= 2 writes speculative entries at
positions t+1, t+2, ... which the next refresh overwrites (rollback = a length change). So depth
d's query at position t+d-1 attends to refreshed history at positions <= t plus its own chain.
MTP training (bebop.mtp.train) reproduces exactly this attention pattern.

Checkpoint keys: mtp.pre_fc_norm_embedding.weight, mtp.pre_fc_norm_hidden.weight, mtp.fc.weight,
mtp.layers.{i}.* (trunk layer names), mtp.norm.weight; `mtp_num_hidden_layers` in config.json.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from bebop.model.config import ModelConfig
from bebop.model.kv_cache import KVCache
from bebop.model.layers import DecoderLayer, RMSNorm, attention_context
from bebop.model.packed_linear import PackedLinear

MTP_PREFIX = "mtp."  # every head tensor's name starts with it (module attribute `mtp` of CausalLM)


class MTPHead(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.mtp_num_hidden_layers < 1:
            raise ValueError("MTPHead needs mtp_num_hidden_layers >= 1")
        h, eps, offset = cfg.hidden_size, cfg.rms_norm_eps, cfg.rms_norm_offset
        self.config = cfg
        self.pre_fc_norm_embedding = RMSNorm(h, eps, offset)
        self.pre_fc_norm_hidden = RMSNorm(h, eps, offset)
        self.fc = PackedLinear(2 * h, h, bias=False)
        layer_cfg = replace(cfg, intermediate_size=cfg.mtp_intermediate_size or cfg.intermediate_size)
        self.layers = nn.ModuleList(DecoderLayer(layer_cfg, i) for i in range(cfg.mtp_num_hidden_layers))
        self.norm = RMSNorm(h, eps, offset)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def new_cache(self, batch_size: int, capacity: int, *, dtype: torch.dtype, device: torch.device) -> KVCache:
        cfg = self.config
        return KVCache(self.num_layers, batch_size, cfg.num_key_value_heads, cfg.head_dim, capacity,
                       dtype=dtype, device=device)

    def combine(self, hidden: torch.Tensor, token_embeds: torch.Tensor) -> torch.Tensor:
        """hidden (..., H), token_embeds (..., H) -> fc input mix (..., H)."""
        mixed = torch.cat([self.pre_fc_norm_embedding(token_embeds), self.pre_fc_norm_hidden(hidden)], dim=-1)
        return self.fc(mixed)

    def forward(self, hidden: torch.Tensor, token_embeds: torch.Tensor, depth: int, cache: KVCache,
                num_new: torch.Tensor) -> torch.Tensor:
        """One cached MTP step at `depth` (1-based) over a ragged chunk.

        hidden (B, T, H): trunk hidden (depth 1) or the previous depth's output;
        token_embeds (B, T, H): embeddings of the next tokens; num_new (B,): tokens kept per row.
        Depth 1 is the refresh: it runs every MTP layer so each layer's cache holds the history,
        and returns layer 0's output. Returns (B, T, H) after `norm`."""
        x = self.combine(hidden, token_embeds)  # (B, T, H)
        positions = cache.positions(x.shape[1])  # (B, T)
        cfg = self.config
        ctx = attention_context(positions, cache, cfg.rotary_dim, cfg.rope_theta, x.dtype)
        if depth == 1:
            outs = [layer(x, ctx) for layer in self.layers]
            out = outs[0]
        else:
            assert ctx.mask is not None  # a cache always gives a mask
            ctx.mask = self._hide_other_layers(ctx.mask, positions, depth)
            out = self.layers[(depth - 1) % self.num_layers](x, ctx)
        cache.advance(num_new, x.shape[1])
        return self.norm(out)

    def _hide_other_layers(self, mask: torch.Tensor, positions: torch.Tensor, depth: int) -> torch.Tensor:
        """With L > 1 layers, a depth-d query must not see the chain entries that other layers
        wrote (at depths j < d with (j-1) % L != (d-1) % L): they are absent from its cache."""
        if self.num_layers == 1:
            return mask
        layer = (depth - 1) % self.num_layers
        keys = torch.arange(mask.shape[-1], device=mask.device)  # (S,)
        for j in range(2, depth):
            if (j - 1) % self.num_layers != layer:
                other = positions[:, :, None] - (depth - j)  # (B, T, 1): where depth j's entry sits
                mask = mask & (keys[None, None, :] != other)[:, None]
        return mask
