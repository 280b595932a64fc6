"""Teacher-forced MTP chains for training, with exactly the inference attention pattern.

For every position t of a sequence and depth d = 1..D (docs/method.md section 4):

    input   hidden: h_t (trunk, after its final norm) for d = 1, else the depth d-1 output of chain t
            (after the head's norm)
            token:  x_{t+d} (the data token; teacher forcing)
    layer   layers[(d-1) % L] at position t+d-1
    target  the trunk's distribution at position t+d (predicts x_{t+d+1})

Attention matches the cached drafting of bebop.model.mtp: the depth-d query of chain t sees the
*refresh* keys of its layer at positions 0..t (the depth-1 inputs (h_s, x_{s+1}) run through that
layer) plus chain t's own entries at depths 2..d that used the same layer. So a head trained here
is evaluated in inference on the very function it was trained on.
"""

from __future__ import annotations

import math
from typing import cast

import torch

from bebop.model.config import ModelConfig
from bebop.model.layers import DecoderLayer
from bebop.model.mtp import MTPHead
from bebop.model.rope import rope_cos_sin


def _expand_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, Hkv, T, Dh) -> (B, Hq, T, Dh) for grouped-query attention."""
    return x.repeat_interleave(groups, dim=1) if groups > 1 else x


def _layer_step(layer: DecoderLayer, x: torch.Tensor, offset: int, cfg: ModelConfig,
                memory: tuple[torch.Tensor, torch.Tensor] | None,
                own: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """One decoder layer over all chains at one depth.

    x (B, T, H) at positions offset..offset+T-1. memory: this layer's refresh keys/values (B, Hkv, T, Dh),
    causal over chain starts, or None at depth 1 (then this call's own k/v are the memory).
    own: earlier same-layer entries of each chain [(k, v) (B, Hkv, T, Dh)].
    Returns the layer output (B, T, H) and this call's (k, v)."""
    attn = layer.self_attn
    h = layer.input_layernorm(x)
    t = x.shape[1]
    positions = torch.arange(offset, offset + t, device=x.device).expand(x.shape[0], t)  # (B, T)
    cos, sin = rope_cos_sin(positions, cfg.rotary_dim, cfg.rope_theta, h.dtype, limit=offset + t)
    q, k, v, gate = attn.project(h, cos, sin)  # (B, Hq, T, Dh), (B, Hkv, T, Dh) x2, (B, T, Hq * Dh) or None
    groups = attn.num_heads // attn.num_kv_heads
    mem_k, mem_v = memory if memory is not None else (k, v)
    scale = 1.0 / math.sqrt(attn.head_dim)
    causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()  # (T, T): key s <= chain t
    scores = [(q @ _expand_kv(mem_k, groups).transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))]
    values = [_expand_kv(mem_v, groups)]
    entries = own + ([(k, v)] if memory is not None else [])
    for ek, ev in entries:
        scores.append((q * _expand_kv(ek, groups)).sum(-1, keepdim=True) * scale)  # (B, Hq, T, 1)
    probs = torch.softmax(torch.cat(scores, dim=-1), dim=-1)  # (B, Hq, T, T + len(entries))
    out = probs[..., :t] @ values[0]  # (B, Hq, T, Dh)
    for j, (_, ev) in enumerate(entries):
        out = out + probs[..., t + j: t + j + 1] * _expand_kv(ev, groups)
    x = x + attn.output(out, gate)
    x = x + layer.mlp(layer.post_attention_layernorm(x))
    return x, (k, v)


def chain_forward(head: MTPHead, hidden: torch.Tensor, token_embeds: list[torch.Tensor]) -> list[torch.Tensor]:
    """hidden (B, T, H) trunk states (after the final norm); token_embeds[d-1] (B, T, H) = embedding of x_{t+d}.

    Returns the head's output (after its norm) for each depth: D tensors (B, T, H)."""
    b, t, _ = hidden.shape
    cfg = head.config
    num_layers = head.num_layers
    layers = cast(list[DecoderLayer], list(head.layers))  # nn.ModuleList types its items as Module
    memory: list[tuple[torch.Tensor, torch.Tensor]] = []
    own: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(num_layers)]
    outputs = []
    x_in = hidden
    for depth, embeds in enumerate(token_embeds, start=1):
        x = head.combine(x_in, embeds)  # (B, T, H)
        if depth == 1:
            results = [_layer_step(layer, x, 0, cfg, None, []) for layer in layers]
            memory = [kv for _, kv in results]
            out = results[0][0]
        else:
            li = (depth - 1) % num_layers
            out, kv = _layer_step(layers[li], x, depth - 1, cfg, memory[li], own[li])
            own[li].append(kv)
        out = head.norm(out)  # (B, T, H): what the LM head reads and the next depth takes
        outputs.append(out)
        x_in = out
    return outputs


def shifted(x: torch.Tensor, d: int, pad_value: float) -> torch.Tensor:
    """x (B, T, ...) -> (B, T, ...) with out[:, t] = x[:, t+d], `pad_value` past the end."""
    pad = x.new_full((x.shape[0], min(d, x.shape[1]), *x.shape[2:]), pad_value)
    return torch.cat([x[:, d:], pad], dim=1)
