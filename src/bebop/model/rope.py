"""Rotary position embeddings (rotate-half RoPE, partial rotary): the tables, built once per process, and
their application.

    cos, sin = rope_table(Dh, theta, dtype, device, limit)   # (N, Dh), N >= limit, a power of two
    cos, sin = rope_cos_sin(positions, Dh, theta, dtype, limit)   # (B, 1, T, Dh) for positions (B, T)
    q = apply_rope(q, cos, sin)

A cache hands its table to attention (KVCache.rope_table), so a compiled step takes it as an input and reads
no module state.
"""

from __future__ import annotations

import torch

_ROPE_TABLES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # (Dh, theta, dtype, device) -> cos, sin (N, Dh)


def rope_table(head_dim: int, theta: float, dtype: torch.dtype, device: torch.device,
                limit: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (N, Dh) for positions 0..N-1, N >= limit: built once, grown to powers of two (a decode
    step then reads two rows instead of computing eight small ops; a compiled graph, which guards on N,
    recompiles only when N doubles)."""
    key = (head_dim, theta, dtype, device)
    table = _ROPE_TABLES.get(key)
    if table is None or table[0].shape[0] < limit:
        size = 1 << max(limit - 1, 255).bit_length()  # a power of two >= 256: a compiled step guards on the size
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
        angles = torch.arange(size, device=device, dtype=torch.float32)[:, None] * inv_freq  # (N, Dh/2)
        angles = torch.cat([angles, angles], dim=-1)  # (N, Dh)
        table = angles.cos().to(dtype), angles.sin().to(dtype)
        _ROPE_TABLES[key] = table
    return table


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype,
                 limit: int) -> tuple[torch.Tensor, torch.Tensor]:
    """positions (B, T), all < limit (a host-known bound) -> cos, sin (B, 1, T, Dh) for rotate-half
    RoPE on (B, heads, T, Dh)."""
    cos, sin = rope_table(head_dim, theta, dtype, positions.device, limit)
    return cos[positions][:, None], sin[positions][:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, heads, T, Dh) rotated by position; cos, sin (B, 1, T, Dr), Dr <= Dh: the first Dr
    dimensions rotate, the rest pass through (partial rotary)."""
    rot = cos.shape[-1]
    if rot < x.shape[-1]:
        return torch.cat([apply_rope(x[..., :rot], cos, sin), x[..., rot:]], dim=-1)
    half = rot // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
