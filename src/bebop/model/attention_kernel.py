"""Attention over a KV cache as a CPU kernel (attention_kernel.cpp, one of model/native.py's ops).

    out = cached_attention(q, k, v, mask)   # q (B, Hq, T, D), k, v (B, Hkv, S, D), mask (B, 1, T, S) bool

The same attention as `F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)` (and tested
against it), where the kernel takes the operands: float32 on a CPU, outside autograd. It reads each cached key
and value once for all the queries of a (row, KV head), where torch's CPU flash attention runs one small matrix
product per (row, query head): at a decode step's one query a row, their fixed cost is most of the attention's
time, and a bool mask sends it to its slower general path (docs/benchmarks.md). Each query is computed alone in a
fixed order, so a row's numbers depend neither on the batch, nor on the chunk (a decode step's one position, a
verify's k + 1, a prefill's prompt), nor on the path that scored its keys. It serves every cached chunk, as an op a
compiled graph calls too; bfloat16, a GPU, training and a machine without the native build keep torch's call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bebop.model import native

# torch.ops.bebop_native.cached_attention where the native ops are loaded (built on first use), else None
cpu_kernel = native.Op("cached_attention")


def fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether the kernel takes these operands: float32 CPU tensors outside autograd, each key and value a
    contiguous row, a bool mask (B, 1 or Hq, T, S), whole groups of query heads per KV head."""
    return (mask is not None and q.device.type == "cpu"
            and q.dtype == k.dtype == v.dtype == torch.float32 and mask.dtype == torch.bool and mask.dim() == 4
            and k.stride(-1) == 1 and v.stride(-1) == 1 and q.shape[1] % k.shape[1] == 0
            and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)))


def cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """q (B, Hq, T, D) over k, v (B, Hkv, S, D) where mask (B, 1, T, S) is True -> (B, Hq, T, D), scaled by
    1 / sqrt(D), query head j reading KV head j // (Hq / Hkv)."""
    kernel = cpu_kernel() if fits(q, k, v, mask) else None
    if kernel is None or mask is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    out = q.new_empty(q.shape)  # (B, Hq, T, D)
    kernel(q.contiguous(), k, v, mask, q.shape[-1] ** -0.5, out)
    return out
