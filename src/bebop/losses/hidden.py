"""The draft loss from hidden states: the shared LM head's logits recomputed chunk by chunk, so no
(N, K, V) tensor is ever made -- not the draft logits, not the targets, not the gradient.

    inputs = DraftHiddenInputs(draft_hidden, target_hidden, lm_head_weight, temperature, mask)
    out = draft_loss_from_hidden("e2e_tv", inputs)     # the same DraftLossOutput as draft_loss
    out.loss.backward()     # into draft_hidden (and into the weight, if it requires grad)

Shapes: N chains, K depths, H hidden, V vocab, c chains in a chunk. Per chunk of kept chains:
z = draft_hidden[c] @ W^T / temperature (c, K, V), p = softmax(target_hidden[c] @ W^T / temperature),
and the row values of bebop.losses.rows (the same chunk loop serves the logits path). The gradient
d loss / d draft_hidden = grad_rows * (dRow/dz @ W) / temperature, per row. Row (n, k) depends on
draft_hidden[n, k] alone, so with a frozen weight (MTP training) the forward takes each row's own
gradient dRow/dz @ W / temperature (N, K, H) from the chunk it already holds, and backward only
scales it by grad_rows: nothing is recomputed. With a weight that requires grad, backward instead
recomputes z and p per chunk and also returns d loss / d W = (grad_rows * dRow/dz)^T draft_hidden /
temperature. The target never gets a gradient: target_hidden is detached and p is a constant of the
loss, as in `draft_loss`.

Equal, up to float rounding, to
    draft_loss(name, DraftLossInputs(draft_hidden @ W.T / T, softmax(target_hidden @ W.T / T), mask))
which `DraftHiddenInputs.materialise()` builds (small batches: diagnostics, tests).

Precision (deliberate): autocast is switched off inside; the two LM-head products (the logits, and
the gradient's product with W) take their operands in the *matmul dtype*, and everything after the
product (softmax, values, the row gradients) runs in the compute dtype (float32, or float64 when an
input is float64). The matmul dtype is the ambient autocast dtype when autocast is on for the
inputs' device when the loss is called (bf16 mixed precision: what an `lm_head(x).float()` under
autocast would do, so fused == unfused there too), else the compute dtype. W is cast to it once per
forward and once per backward (a (V, H) copy, only when the dtypes differ), never per chunk.

Memory (peak extra, beyond the inputs): the chunk loop holds a handful (under 8) of (chunk_size, K, V)
compute-dtype temporaries; the per-row gradients (N, K, H) from forward to backward, and the
gradient wrt draft_hidden (N, K, H); under autocast, W's cast (V, H) while a loop runs; with a weight
that requires grad, its float gradient (V, H). Nothing (N, K, V).
Work: per chain and depth, the LM-head product for the draft and for the target, and one more for the
gradient (3 products of H x V; the full-logits trainer did 1 + 2 per depth, its trunk's logits
once per position); with a weight that requires grad, backward repeats the first two and adds one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch
from torch.autograd.function import once_differentiable

from bebop.errors import BebopError
from bebop.losses.draft import DraftLossInputs, DraftLossOutput, chain_output, draft_spec, kept_chains
from bebop.losses.rows import DEFAULT_CHUNK_SIZE, ROW_LOSSES, RowLoss, chunk_grads, chunk_rows, compute_dtype

Tensor = torch.Tensor


@dataclass
class DraftHiddenInputs:
    draft_hidden: Tensor  # (N, K, H) the MTP head's outputs (after its norm); receives the gradient
    target_hidden: Tensor  # (N, K, H) the trunk's hidden states (after its final norm) at the target positions
    lm_head: Tensor  # (V, H) the shared LM-head weight: logits = hidden @ lm_head.T
    temperature: float = 1.0  # both logits are divided by it
    mask: Tensor | None = None  # (N,) bool, True = chain kept; None keeps every chain

    def materialise(self) -> DraftLossInputs:
        """The same chains as full (N, K, V) draft logits and target probabilities (small batches only)."""
        dtype = compute_dtype(self.draft_hidden, self.target_hidden, self.lm_head)
        w = self.lm_head
        draft_logits = torch.nn.functional.linear(self.draft_hidden, w).to(dtype) / self.temperature  # (N, K, V)
        with torch.no_grad():
            logits = torch.nn.functional.linear(self.target_hidden, w).to(dtype)  # (N, K, V)
            target = torch.softmax(logits / self.temperature, dim=-1)
        return DraftLossInputs(draft_logits, target, self.mask)


@dataclass(frozen=True)
class _Head:
    """The LM head as the chunks apply it."""

    weight: Tensor  # (V, H) in the matmul dtype
    temperature: float
    dtype: torch.dtype  # the compute dtype

    def logits(self, hidden: Tensor) -> Tensor:
        """(c, K, H) -> (c, K, V) in the compute dtype, divided by the temperature."""
        return (hidden.to(self.weight.dtype) @ self.weight.T).to(self.dtype).div_(self.temperature)


def _hidden_chunk(head: _Head, draft_hidden: Tensor, target_hidden: Tensor, idx: Tensor):
    """A bebop.losses.rows.ChunkLoad: kept chains idx (c,) -> log q, q, p (c, K, V)."""
    logq = torch.log_softmax(head.logits(draft_hidden.index_select(0, idx)), dim=-1)  # (c, K, V)
    p = torch.softmax(head.logits(target_hidden.index_select(0, idx)), dim=-1)  # (c, K, V)
    return logq, logq.exp(), p


def _hidden_grad(head: _Head, g: Tensor) -> Tensor:
    """g = d . / d z (c, K, V) for z = h W^T / T -> d . / d h = g W / T (c, K, H) in the compute dtype."""
    gh = (g.to(head.weight.dtype).flatten(0, 1) @ head.weight).to(head.dtype).div_(head.temperature)  # (c*K, H)
    return gh.view(g.shape[0], g.shape[1], gh.shape[-1])


def _store_row_grad(head: _Head, jac: Tensor, idx: Tensor, g: Tensor) -> None:
    """jac[idx] = d row / d draft_hidden (c, K, H), from g = d row / d z (c, K, V)."""
    jac.index_copy_(0, idx, _hidden_grad(head, g))


def _backward_chunk(head: _Head, g: Tensor, idx: Tensor, draft_hidden: Tensor, grad_h: Tensor | None,
                    grad_w: Tensor | None) -> None:
    """g = d loss / d z (c, K, V) for z = h W^T / T: grad_h[idx] = g W / T; grad_w += g^T h / T."""
    if grad_h is not None:
        grad_h.index_copy_(0, idx, _hidden_grad(head, g).to(grad_h.dtype))
    if grad_w is not None:
        h = draft_hidden.index_select(0, idx).flatten(0, 1).to(head.weight.dtype)  # (c*K, H)
        grad_w.add_((g.to(head.weight.dtype).flatten(0, 1).T @ h).to(head.dtype).div_(head.temperature))  # (V, H)


class _FusedHiddenRows(torch.autograd.Function):
    """(draft_hidden (N, K, H), target_hidden (N, K, H), weight (V, H), kept (M,)) -> rows (N, K), tv (N, K).

    As bebop.losses.rows._FusedRows, with the logits computed per chunk from the hidden states. Two
    ways to the gradient. Row (n, k) depends on draft_hidden[n, k] alone, so with `jacobian` (a frozen
    weight) the forward also takes each row's own gradient J[n, k] = d row / d draft_hidden[n, k]
    (N, K, H) from the chunk it already holds, and backward is grad_rows * J: nothing recomputed.
    Otherwise (the weight needs a gradient, a sum over rows weighted by grad_rows) backward
    recomputes each chunk's logits and targets."""

    @staticmethod
    def forward(ctx, draft_hidden, target_hidden, weight, kept, kind: RowLoss, temperature: float,
                mm_dtype: torch.dtype, chunk_size: int, jacobian: bool):
        n, k, h = draft_hidden.shape
        dtype = compute_dtype(draft_hidden, target_hidden, weight)
        rows = draft_hidden.new_zeros((n, k), dtype=dtype)
        tv = draft_hidden.new_zeros((n, k), dtype=dtype)
        jac = draft_hidden.new_zeros((n, k, h), dtype=dtype) if jacobian else None  # (N, K, H)
        with torch.autocast(draft_hidden.device.type, enabled=False):
            head = _Head(weight.to(mm_dtype), temperature, dtype)
            row_grad = None if jac is None else partial(_store_row_grad, head, jac)
            chunk_rows(partial(_hidden_chunk, head, draft_hidden, target_hidden), kept, kind, chunk_size, rows, tv,
                       row_grad)
        ctx.save_for_backward(draft_hidden, target_hidden, weight, kept, jac)
        ctx.kind, ctx.temperature, ctx.mm_dtype, ctx.chunk_size = kind, temperature, mm_dtype, chunk_size
        ctx.mark_non_differentiable(tv)
        return rows, tv

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_rows, grad_tv):
        draft_hidden, target_hidden, weight, kept, jac = ctx.saved_tensors
        need_h, _, need_w = ctx.needs_input_grad[:3]
        if jac is not None and not need_w:
            grad_h = (jac * grad_rows.unsqueeze(-1)).to(draft_hidden.dtype) if need_h else None  # (N, K, H)
            return grad_h, None, None, None, None, None, None, None, None
        dtype = compute_dtype(draft_hidden, target_hidden, weight)
        grad_h = torch.zeros_like(draft_hidden) if need_h else None  # (N, K, H)
        grad_w = torch.zeros(weight.shape, dtype=dtype, device=weight.device) if need_w else None  # (V, H)
        with torch.autocast(draft_hidden.device.type, enabled=False):
            head = _Head(weight.to(ctx.mm_dtype), ctx.temperature, dtype)
            load = partial(_hidden_chunk, head, draft_hidden, target_hidden)
            for idx, g in chunk_grads(load, kept, ctx.kind, ctx.chunk_size, grad_rows):
                _backward_chunk(head, g, idx, draft_hidden, grad_h, grad_w)
        return grad_h, None, None if grad_w is None else grad_w.to(weight.dtype), None, None, None, None, None, None


def matmul_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The LM-head products' operand dtype: the autocast dtype where autocast is on (float64 is never
    autocast, as in torch), else the compute dtype."""
    if dtype != torch.float64 and torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return dtype


def _check_hidden(inputs: DraftHiddenInputs) -> Tensor:
    """Validate at the public boundary; return the kept chains' indices (M,) int64."""
    h, t, w = inputs.draft_hidden, inputs.target_hidden, inputs.lm_head
    if not all(isinstance(x, Tensor) for x in (h, t, w)):
        raise BebopError("draft_hidden, target_hidden and lm_head must be tensors")
    if h.dim() != 3:
        raise BebopError(f"draft_hidden must be (N, K, H), got shape {tuple(h.shape)}")
    if t.shape != h.shape:
        raise BebopError(f"target_hidden shape {tuple(t.shape)} does not match draft_hidden (N, K, H) = "
                         f"{tuple(h.shape)}")
    if w.dim() != 2 or w.shape[1] != h.shape[2] or w.shape[0] < 1:
        raise BebopError(f"lm_head must be (V, H) with H = {h.shape[2]}, got shape {tuple(w.shape)}")
    if h.shape[1] < 1 or h.shape[2] < 1:
        raise BebopError(f"need K >= 1 depths and H >= 1, got (N, K, H) = {tuple(h.shape)}")
    if not all(x.is_floating_point() for x in (h, t, w)):
        raise BebopError(f"draft_hidden, target_hidden and lm_head must be floating point, got {h.dtype}, "
                         f"{t.dtype}, {w.dtype}")
    if t.device != h.device or w.device != h.device:
        raise BebopError(f"draft_hidden on {h.device}, target_hidden on {t.device}, lm_head on {w.device}: "
                         f"they must share a device")
    temp = inputs.temperature
    if isinstance(temp, bool) or not isinstance(temp, (int, float)) or not (math.isfinite(temp) and temp > 0):
        raise BebopError(f"temperature must be a finite number > 0, got {temp!r}")
    return kept_chains(inputs.mask, h.shape[0], h.device)


def draft_loss_from_hidden(name: str, inputs: DraftHiddenInputs, *,
                           chunk_size: int = DEFAULT_CHUNK_SIZE) -> DraftLossOutput:
    """The named draft loss over (N, K) chains given as hidden states, chunk_size chains at a time.

    Same contract as `draft_loss` (masked chains never read, exactly zero gradient; no kept chain:
    a zero loss that still backpropagates, NaN metrics), on the logits the LM head would give."""
    spec = draft_spec(name, chunk_size)
    kept = _check_hidden(inputs)
    h = inputs.draft_hidden
    mm = matmul_dtype(h.device, compute_dtype(h, inputs.target_hidden, inputs.lm_head))
    grad = torch.is_grad_enabled()
    jacobian = grad and h.requires_grad and not inputs.lm_head.requires_grad  # training: the LM head is frozen
    rows, tv = _FusedHiddenRows.apply(h, inputs.target_hidden.detach(), inputs.lm_head, kept, ROW_LOSSES[spec.row],
                                      float(inputs.temperature), mm, chunk_size, jacobian)  # (N, K) each
    return chain_output(spec, rows, tv, kept)
