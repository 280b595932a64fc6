"""Per-row draft losses over the full vocabulary, fused and chunked, with closed-form gradients.

Shapes: N chains (or rows), K depths, V vocab. Draft q = softmax(draft_logits); target
p = target_probs, detached (it never receives a gradient).

| loss | value per row                      | d value / d z_j                                      |
|------|------------------------------------|------------------------------------------------------|
| ce   | -sum_v p_v log q_v                 | q_j * sum(p) - p_j   (= q_j - p_j when p sums to 1)  |
| kl   | KL(p || q), 0 log 0 = 0            | same as ce                                           |
| rkl  | KL(q || max(p, RKL_TARGET_FLOOR))  | q_j (log(q_j / p_j) - KL(q || p))                    |
| tv   | 1 - sum_v min(p_v, q_v)            | q_j (S - 1 + [q_j > p_j]),  S = sum_v q_v [q_v <= p_v] |

TV is piecewise linear: at an exact tie q_v == p_v we take min(p_v, q_v) = q_v, i.e. the
subgradient of the formula above (the tie counts in S and not in [q_j > p_j]).

Memory: the chunk loop (`chunk_rows` forward, `chunk_grads` backward) walks the kept chains
`chunk_size` at a time; where a chunk's logits come from is a `ChunkLoad`: sliced from whole
(N, K, V) logits here (`_FusedRows`), or recomputed from hidden states (bebop.losses.hidden, which
never makes an (N, K, V) tensor). Forward and backward each hold a handful (under 8) of
(chunk_size, K, V) temporaries in the compute dtype (float32, or float64 when an input is float64),
never an (N, K, V) one, and autograd saves only references to the inputs (draft_logits stays alive
until backward), not activations. In `_FusedRows` the one (N, K, V) allocation is the gradient wrt
draft_logits itself (same size and dtype as draft_logits), written chunk by chunk. Peak extra memory:
grad (N*K*V in the logits dtype) + O(chunk_size * K * V) compute floats + O(N * K).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
from torch.autograd.function import once_differentiable

from bebop.errors import BebopError

Tensor = torch.Tensor

DEFAULT_CHUNK_SIZE = 16  # chains per chunk: 16 * K=5 * V=151936 * 4 B ~ 49 MB per float32 temporary
RKL_TARGET_FLOOR = 1e-12
"""rkl clamps p to at least this inside log p: where the target gives a token 0 and the draft
does not, KL(q || p) is infinite; with the floor it costs q_v * (log q_v + 27.6) nats instead,
a large finite penalty with a finite gradient that pushes q_v down."""


@dataclass(frozen=True)
class RowLoss:
    """One per-row loss: value and its exact gradient wrt the logits, from (log q, q, p) (rows, V)."""

    name: str
    value: Callable[[Tensor, Tensor, Tensor], Tensor]  # -> (rows,)
    grad: Callable[[Tensor, Tensor, Tensor], Tensor]  # -> (rows, V)


def _plogq(p: Tensor, logq: Tensor) -> Tensor:
    return torch.where(p > 0, p * logq, 0.0)  # 0 * log 0 = 0, even where log q = -inf


def _ce_value(logq: Tensor, q: Tensor, p: Tensor) -> Tensor:
    return -_plogq(p, logq).sum(-1)


def _kl_value(logq: Tensor, q: Tensor, p: Tensor) -> Tensor:
    return (torch.xlogy(p, p) - _plogq(p, logq)).sum(-1)


def _forward_grad(logq: Tensor, q: Tensor, p: Tensor) -> Tensor:
    return q * p.sum(-1, keepdim=True) - p


def _rkl_terms(logq: Tensor, q: Tensor, p: Tensor) -> Tensor:
    log_ratio = logq - torch.log(p.clamp_min(RKL_TARGET_FLOOR))  # (rows, V)
    return torch.where(q > 0, log_ratio, 0.0)


def _rkl_value(logq: Tensor, q: Tensor, p: Tensor) -> Tensor:
    return (q * _rkl_terms(logq, q, p)).sum(-1)


def _rkl_grad(logq: Tensor, q: Tensor, p: Tensor) -> Tensor:
    terms = _rkl_terms(logq, q, p)  # (rows, V)
    return q * (terms - (q * terms).sum(-1, keepdim=True))


def _tv_value(logq: Tensor, q: Tensor, p: Tensor) -> Tensor:
    return 1.0 - torch.minimum(p, q).sum(-1)


def _tv_grad(logq: Tensor, q: Tensor, p: Tensor) -> Tensor:
    below = q <= p  # (rows, V); ties count as below: min(p, q) = q there
    s = torch.where(below, q, 0.0).sum(-1, keepdim=True)  # S
    return q * (s - below.to(q.dtype))  # = q (S - 1 + [q > p])


ROW_LOSSES: dict[str, RowLoss] = {
    "ce": RowLoss("ce", _ce_value, _forward_grad),
    "kl": RowLoss("kl", _kl_value, _forward_grad),
    "rkl": RowLoss("rkl", _rkl_value, _rkl_grad),
    "tv": RowLoss("tv", _tv_value, _tv_grad),
}


def compute_dtype(*inputs: Tensor) -> torch.dtype:
    """float32, or float64 when any input is float64 (bf16/fp16 are upcast per chunk)."""
    dtype = torch.float32
    for x in inputs:
        dtype = torch.promote_types(dtype, x.dtype)
    return dtype


ChunkLoad = Callable[[Tensor], tuple[Tensor, Tensor, Tensor]]
"""Kept chains idx (c,) -> (log q, q, p), each (c, K, V) in the compute dtype: where one chunk's
distributions come from (logits given whole, or recomputed from hidden states: bebop.losses.hidden)."""


def chunk_rows(load: ChunkLoad, kept: Tensor, kind: RowLoss, chunk_size: int, rows: Tensor, tv: Tensor,
               row_grad: Callable[[Tensor, Tensor], None] | None = None) -> None:
    """Forward over the kept chains, chunk_size at a time: rows[idx] = kind's value, tv[idx] = TV, (N, K) each.
    With `row_grad`, also row_grad(idx (c,), d row / d logits (c, K, V)) per chunk, from the same (log q, q, p)."""
    for idx in kept.split(chunk_size):
        logq, q, p = load(idx)
        rows[idx] = kind.value(logq, q, p)
        tv[idx] = _tv_value(logq, q, p)
        if row_grad is not None:
            g = kind.grad(logq, q, p)  # (c, K, V)
            del logq, q, p
            row_grad(idx, g)


def chunk_grads(load: ChunkLoad, kept: Tensor, kind: RowLoss, chunk_size: int,
                grad_rows: Tensor) -> Iterator[tuple[Tensor, Tensor]]:
    """Backward over the kept chains: yields (idx (c,), d loss / d logits (c, K, V) in the compute dtype),
    the closed-form row gradient times the upstream grad_rows (N, K), one chunk at a time."""
    for idx in kept.split(chunk_size):
        logq, q, p = load(idx)
        g = kind.grad(logq, q, p)  # (c, K, V), a fresh tensor
        del logq, q, p  # only g stays alive while the caller uses it
        yield idx, g.mul_(grad_rows.index_select(0, idx).unsqueeze(-1))


def _logits_chunk(draft_logits: Tensor, target_probs: Tensor, dtype: torch.dtype, idx: Tensor):
    z = draft_logits.index_select(0, idx).to(dtype)  # (c, K, V)
    logq = torch.log_softmax(z, dim=-1)
    return logq, logq.exp(), target_probs.index_select(0, idx).to(dtype)


class _FusedRows(torch.autograd.Function):
    """(draft_logits (N, K, V), target_probs (N, K, V), kept (M,) int64) -> rows (N, K), tv (N, K).

    rows is the chosen RowLoss, tv the total variation (a metric: no gradient). Chains not in
    `kept` are never read: their rows are 0 and their gradient is exactly 0."""

    @staticmethod
    def forward(ctx, draft_logits, target_probs, kept, kind: RowLoss, chunk_size: int):
        n, k, _ = draft_logits.shape
        dtype = compute_dtype(draft_logits, target_probs)
        rows = draft_logits.new_zeros((n, k), dtype=dtype)
        tv = draft_logits.new_zeros((n, k), dtype=dtype)
        chunk_rows(partial(_logits_chunk, draft_logits, target_probs, dtype), kept, kind, chunk_size, rows, tv)
        ctx.save_for_backward(draft_logits, target_probs, kept)
        ctx.kind, ctx.chunk_size = kind, chunk_size
        ctx.mark_non_differentiable(tv)
        return rows, tv

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_rows, grad_tv):
        draft_logits, target_probs, kept = ctx.saved_tensors
        grad = torch.zeros_like(draft_logits)  # (N, K, V): the only full-size allocation
        load = partial(_logits_chunk, draft_logits, target_probs, compute_dtype(draft_logits, target_probs))
        for idx, g in chunk_grads(load, kept, ctx.kind, ctx.chunk_size, grad_rows):
            grad.index_copy_(0, idx, g.to(grad.dtype))
        return grad, None, None, None, None


def fused_rows(name: str, draft_logits: Tensor, target_probs: Tensor, kept: Tensor,
               chunk_size: int) -> tuple[Tensor, Tensor]:
    """Unchecked core: (N, K, V), (N, K, V), kept (M,) int64 -> rows (N, K), tv (N, K) detached."""
    return _FusedRows.apply(draft_logits, target_probs.detach(), kept, ROW_LOSSES[name], chunk_size)


def check_chunk_size(chunk_size: int) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise BebopError(f"chunk_size must be a positive int, got {chunk_size!r}")


def _per_row(name: str, draft_logits: Tensor, target_probs: Tensor, chunk_size: int) -> Tensor:
    if not isinstance(draft_logits, Tensor) or not isinstance(target_probs, Tensor):
        raise BebopError(f"{name}_loss: draft_logits and target_probs must be tensors")
    if draft_logits.dim() != 2 or draft_logits.shape != target_probs.shape:
        raise BebopError(f"{name}_loss: draft_logits {tuple(draft_logits.shape)} and target_probs "
                         f"{tuple(target_probs.shape)} must both be (N, V) and equal")
    if not draft_logits.is_floating_point() or not target_probs.is_floating_point():
        raise BebopError(f"{name}_loss: draft_logits and target_probs must be floating point")
    check_chunk_size(chunk_size)
    kept = torch.arange(draft_logits.shape[0], device=draft_logits.device)
    rows, _ = fused_rows(name, draft_logits.unsqueeze(1), target_probs.unsqueeze(1), kept, chunk_size)
    return rows[:, 0]


def ce_loss(draft_logits: Tensor, target_probs: Tensor, *, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Tensor:
    """(N, V), (N, V) -> (N,) soft cross-entropy -sum p log q."""
    return _per_row("ce", draft_logits, target_probs, chunk_size)


def kl_loss(draft_logits: Tensor, target_probs: Tensor, *, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Tensor:
    """(N, V), (N, V) -> (N,) forward KL(p || q), with 0 log 0 = 0."""
    return _per_row("kl", draft_logits, target_probs, chunk_size)


def rkl_loss(draft_logits: Tensor, target_probs: Tensor, *, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Tensor:
    """(N, V), (N, V) -> (N,) reverse KL(q || p), p floored at RKL_TARGET_FLOOR inside the log."""
    return _per_row("rkl", draft_logits, target_probs, chunk_size)


def tv_loss(draft_logits: Tensor, target_probs: Tensor, *, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Tensor:
    """(N, V), (N, V) -> (N,) total variation 1 - sum min(p, q) = 0.5 sum |p - q|."""
    return _per_row("tv", draft_logits, target_probs, chunk_size)
