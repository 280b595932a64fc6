"""Chain-level draft losses: one entry point `draft_loss(name, inputs)` over (N, K, V) chains.

Shapes: B batch, T time, V vocab, K depths (drafts per chain), N chains (usually B*T flattened).
A chain is the K draft rows produced from one start position t; row d (1-based depth) is
trained against the trunk's distribution at position t + d (docs/method.md section 4).

Per chain, from the per-row values r_1..r_K (see `bebop.losses.rows`):
- ce, kl, rkl, tv: mean over depths, (1/K) sum_d r_d.
- e2e_tv: 1 - (1/K) sum_{j=1..K} prod_{i<=j} (1 - TV_i), one minus the expected accepted
  drafts per step (divided by K) under rejection sampling; earlier depths weigh more.
The loss is the mean over kept chains (mask True). Metrics: TV per depth and the implied
rejection-sampling acceptance 1 - TV per depth, both means over kept chains, detached.

Memory: see `bebop.losses.rows` -- peak extra is the (N, K, V) gradient wrt draft_logits plus
O(chunk_size * K * V) float32 temporaries (a handful), in forward and in backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from bebop.errors import BebopError
from bebop.losses.rows import DEFAULT_CHUNK_SIZE, check_chunk_size, fused_rows

Tensor = torch.Tensor


@dataclass
class DraftLossInputs:
    draft_logits: Tensor  # (N, K, V) the MTP head's logits, any float dtype; receives the gradient
    target_probs: Tensor  # (N, K, V) the trunk's probabilities; detached, never receives a gradient
    mask: Tensor | None = None  # (N,) bool, True = chain kept; None keeps every chain


@dataclass
class DraftLossOutput:
    loss: Tensor  # () mean over kept chains, with grad into draft_logits
    tv_per_depth: Tensor  # (K,) detached mean TV over kept chains; NaN when num_chains == 0
    acceptance_per_depth: Tensor  # (K,) 1 - tv_per_depth: expected RS acceptance at each depth
    num_chains: int  # kept chains


@dataclass(frozen=True)
class _DraftLoss:
    row: str  # which per-row quantity is computed and differentiated (a key of ROW_LOSSES)
    chain: Callable[[Tensor], Tensor]  # rows (N, K) -> per-chain loss (N,)


def _mean_over_depths(rows: Tensor) -> Tensor:
    return rows.mean(-1)


def _e2e_tv_chain(tv: Tensor) -> Tensor:
    return 1.0 - torch.cumprod(1.0 - tv, dim=-1).mean(-1)


DRAFT_LOSSES: dict[str, _DraftLoss] = {
    "ce": _DraftLoss("ce", _mean_over_depths),
    "kl": _DraftLoss("kl", _mean_over_depths),
    "rkl": _DraftLoss("rkl", _mean_over_depths),
    "tv": _DraftLoss("tv", _mean_over_depths),
    "e2e_tv": _DraftLoss("tv", _e2e_tv_chain),
}


def kept_chains(mask: Tensor | None, n: int, device: torch.device) -> Tensor:
    """The kept chains' indices (M,) int64 from a mask (N,) bool (None: all N), checked."""
    if mask is None:
        return torch.arange(n, device=device)
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.shape != (n,):
        got = f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, Tensor) else type(mask).__name__
        raise BebopError(f"mask must be a bool tensor of shape (N,) = ({n},), got {got}")
    return mask.to(device).nonzero().squeeze(-1)  # one host sync: the kept count sizes the loop


def _check_inputs(inputs: DraftLossInputs) -> Tensor:
    """Validate shapes at the public boundary; return the kept chains' indices (M,) int64."""
    logits, target = inputs.draft_logits, inputs.target_probs
    if not isinstance(logits, Tensor) or not isinstance(target, Tensor):
        raise BebopError("draft_logits and target_probs must be tensors")
    if logits.dim() != 3:
        raise BebopError(f"draft_logits must be (N, K, V), got shape {tuple(logits.shape)}")
    if target.shape != logits.shape:
        raise BebopError(f"target_probs shape {tuple(target.shape)} does not match draft_logits (N, K, V) = "
                         f"{tuple(logits.shape)}")
    n, k, v = logits.shape
    if k < 1 or v < 1:
        raise BebopError(f"need K >= 1 depths and V >= 1 vocab entries, got (N, K, V) = {(n, k, v)}")
    if not logits.is_floating_point() or not target.is_floating_point():
        raise BebopError(f"draft_logits and target_probs must be floating point, got {logits.dtype}, {target.dtype}")
    if target.device != logits.device:
        raise BebopError(f"target_probs on {target.device} but draft_logits on {logits.device}")
    return kept_chains(inputs.mask, n, logits.device)


def draft_spec(name: str, chunk_size: int) -> _DraftLoss:
    """The named loss's table entry, with the chunk size checked."""
    spec = DRAFT_LOSSES.get(name)
    if spec is None:
        raise BebopError(f"unknown draft loss {name!r}; known: {', '.join(DRAFT_LOSSES)}")
    check_chunk_size(chunk_size)
    return spec


def chain_output(spec: _DraftLoss, rows: Tensor, tv: Tensor, kept: Tensor) -> DraftLossOutput:
    """rows (N, K) with grad, tv (N, K) detached, kept (M,) -> the chain loss over kept chains and metrics."""
    num_chains = int(kept.numel())
    if num_chains == 0:
        tv_per_depth = torch.full((rows.shape[1],), float("nan"), dtype=tv.dtype, device=tv.device)
        return DraftLossOutput(rows.sum() * 0.0, tv_per_depth, 1.0 - tv_per_depth, 0)
    loss = spec.chain(rows.index_select(0, kept)).mean()
    tv_per_depth = tv.index_select(0, kept).mean(0).detach()
    return DraftLossOutput(loss, tv_per_depth, 1.0 - tv_per_depth, num_chains)


def draft_loss(name: str, inputs: DraftLossInputs, *, chunk_size: int = DEFAULT_CHUNK_SIZE) -> DraftLossOutput:
    """The named draft loss over (N, K, V) chains, chunk_size chains at a time.

    Masked chains are never read (padding rows may hold anything) and get exactly zero gradient.
    With no chain kept the loss is a zero that is still connected to draft_logits, so
    `loss.backward()` works (all-zero gradient), and the metrics are NaN."""
    spec = draft_spec(name, chunk_size)
    kept = _check_inputs(inputs)
    rows, tv = fused_rows(spec.row, inputs.draft_logits, inputs.target_probs, kept, chunk_size)  # (N, K) each
    return chain_output(spec, rows, tv, kept)


def e2e_tv_loss(draft_logits: Tensor, target_probs: Tensor, mask: Tensor | None = None, *,
                chunk_size: int = DEFAULT_CHUNK_SIZE) -> Tensor:
    """(N, K, V), (N, K, V), mask (N,) bool or None -> scalar: mean over kept chains of
    1 - (1/K) sum_j prod_{i<=j} (1 - TV_i)."""
    return draft_loss("e2e_tv", DraftLossInputs(draft_logits, target_probs, mask), chunk_size=chunk_size).loss
