"""Qwen3 / Qwen3.5 building blocks: RMSNorm, rotary embedding, grouped-query attention with q/k
norms (Qwen3.5: an output gate and partial rotary), SwiGLU MLP, and the decoder layer (Qwen3.5:
full attention or Gated DeltaNet linear attention, model/gated_deltanet.py, by `layer_types`).

Parameter names match Hugging Face's except two fused projections (as in vLLM): `qkv_proj`
stacks q_proj, k_proj, v_proj and `gate_up_proj` stacks gate_proj, up_proj, so a decode step
runs two matmuls fewer per layer. checkpoint.py splits and stacks them at the file boundary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bebop.model.attention_kernel import cached_attention
from bebop.model.config import ModelConfig
from bebop.model.context import AttentionContext
from bebop.model.gated_deltanet import GatedDeltaNet
from bebop.model.kv_cache import KVCache
from bebop.model.packed_linear import PackedLinear
from bebop.model.packing import packed_attention
from bebop.model.rope import apply_rope, rope_cos_sin


class RMSNorm(nn.Module):
    """y = w * x / rms(x), computed in float32 like Hugging Face's. `offset=1` gives (1 + w) * ...
    (the Qwen3.5 / Qwen3-Next family's style, used by their MTP heads)."""

    def __init__(self, dim: int, eps: float, offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((dim,), 1.0 - offset))
        self.eps = eps
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """As the reference computes it, for every dtype: Qwen3's `w * normed.to(dtype)`; Qwen3.5's
        `(normed * (1 + w.float())).to(dtype)`, the scale formed in float32 (formed in bfloat16, 1 + w
        rounds nearby scales together)."""
        if x.dtype == torch.float32 and not self.offset:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)  # one fused op
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:
            return (h * (self.offset + self.weight.float())).to(dtype)
        return self.weight * h.to(dtype)


class Attention(nn.Module):
    """Grouped-query attention; `cache_slot` is this layer's index in the KV cache (attention layers
    only: a hybrid's linear layers keep no KV). With `attn_output_gate` (Qwen3.5), q_proj yields, per
    head, the query and then a gate; the attention output is scaled by sigmoid(gate) before o_proj."""

    def __init__(self, cfg: ModelConfig, cache_slot: int) -> None:
        super().__init__()
        self.layer_idx = cache_slot
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.gated = cfg.attn_output_gate
        bias = cfg.attention_bias
        self.q_size = self.num_heads * self.head_dim * (2 if self.gated else 1)
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = PackedLinear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=bias)
        self.o_proj = PackedLinear(self.num_heads * self.head_dim, cfg.hidden_size, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, cfg.rms_norm_offset)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, cfg.rms_norm_offset)

    def project(self, x: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """x (B, T, H) -> q (B, Hq, T, Dh), k, v (B, Hkv, T, Dh), normed and rotated, and the output
        gate (B, T, Hq * Dh) or None."""
        b, t, _ = x.shape
        q, k, v = self.qkv_proj(x).split((self.q_size, self.kv_size, self.kv_size), dim=-1)
        gate = None
        if self.gated:
            q, gate = q.view(b, t, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)  # (B, T, Hq, Dh) x2
            gate = gate.reshape(b, t, -1)  # (B, T, Hq * Dh)
        q = self.q_norm(q.reshape(b, t, self.num_heads, self.head_dim)).transpose(1, 2)  # (B, Hq, T, Dh)
        k = self.k_norm(k.view(b, t, self.num_kv_heads, self.head_dim)).transpose(1, 2)  # (B, Hkv, T, Dh)
        v = v.view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, Dh)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, gate

    def output(self, heads: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        """heads (B, Hq, T, Dh) attention output -> (B, T, H): gated, then o_proj."""
        b, _, t, _ = heads.shape
        out = heads.transpose(1, 2).reshape(b, t, -1)  # (B, T, Hq * Dh)
        return self.o_proj(out if gate is None else out * torch.sigmoid(gate))

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        q, k, v, gate = self.project(x, ctx.cos, ctx.sin)
        if ctx.packing is not None:
            out = packed_attention(q, k, v, ctx.packing)  # (1, Hq, N, Dh)
        elif ctx.cache is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            k, v = ctx.cache.write(self.layer_idx, ctx.positions, k, v)  # (B, Hkv, S, Dh)
            out = cached_attention(q, k, v, ctx.mask)  # (B, Hq, T, Dh)
        return self.output(out, gate)  # (B, T, H)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), gate and up as one matmul."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = PackedLinear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = PackedLinear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class SparseMoE(nn.Module):
    """The Qwen3.5 MoE block: a softmax router picks num_experts_per_tok experts per token (their
    weights renormalised to sum to 1), plus a shared expert scaled by sigmoid(shared_expert_gate(x)).
    Names as the checkpoints store them: gate (the router), experts.{e}.*, shared_expert.*."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.top_k = cfg.num_experts_per_tok
        self.gate = PackedLinear(h, cfg.num_experts, bias=False)
        self.experts = nn.ModuleList(MLP(h, cfg.moe_intermediate_size) for _ in range(cfg.num_experts))
        self.shared_expert = MLP(h, cfg.shared_expert_intermediate_size)
        self.shared_expert_gate = PackedLinear(h, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])  # (N, H)
        probs = torch.softmax(self.gate(flat).float(), dim=-1)  # (N, E)
        weights, chosen = probs.topk(self.top_k, dim=-1)  # (N, k)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)  # (N, H)
        for e in chosen.unique().tolist():  # only the experts some token chose
            rows, slot = torch.where(chosen == e)
            out = out.index_add(0, rows, self.experts[e](flat[rows]) * weights[rows, slot, None])
        return out.reshape(x.shape)


class DecoderLayer(nn.Module):
    """A pre-norm residual block: full attention (`self_attn`) or Gated DeltaNet (`linear_attn`),
    then the MLP. `slot`: the layer's index among layers of its kind (its cache slot)."""

    def __init__(self, cfg: ModelConfig, slot: int, kind: str = "full_attention") -> None:
        super().__init__()
        eps, offset = cfg.rms_norm_eps, cfg.rms_norm_offset
        self.kind = kind
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps, offset)
        if kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg, slot)
        else:
            self.self_attn = Attention(cfg, slot)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps, offset)
        self.mlp = SparseMoE(cfg) if cfg.num_experts else MLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        h = self.input_layernorm(x)
        x = x + (self.linear_attn(h, ctx) if self.kind == "linear_attention" else self.self_attn(h, ctx))
        return x + self.mlp(self.post_attention_layernorm(x))


def trunk_layers(cfg: ModelConfig) -> list[DecoderLayer]:
    """The trunk's layers in order, each with its kind and its slot among layers of that kind."""
    slots = {i: j for layers in (cfg.attention_layers, cfg.linear_layers) for j, i in enumerate(layers)}
    return [DecoderLayer(cfg, slots[i], cfg.layer_type(i)) for i in range(cfg.num_hidden_layers)]


def attention_context(positions: torch.Tensor, cache: KVCache | None, rotary_dim: int, theta: float,
                      dtype: torch.dtype) -> AttentionContext:
    """Rotary tables and mask for a chunk at `positions` (B, T)."""
    if cache is None:
        cos, sin = rope_cos_sin(positions, rotary_dim, theta, dtype, positions.shape[1])
    else:
        table_cos, table_sin = cache.rope_table(rotary_dim, theta, dtype)  # (N, Dr) each, N >= capacity
        cos, sin = table_cos[positions][:, None], table_sin[positions][:, None]  # (B, 1, T, Dr)
    mask = None
    if cache is not None:
        span = cache.key_span(positions.shape[1])
        keys = torch.arange(span, device=positions.device)  # (S,)
        mask = (keys[None, None, :] <= positions[:, :, None])[:, None]  # (B, 1, T, S)
    return AttentionContext(cos=cos, sin=sin, positions=positions, mask=mask, cache=cache)
