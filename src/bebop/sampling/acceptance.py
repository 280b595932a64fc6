"""Lossless draft acceptance for one speculative step: rejection sampling (RS) and target-only (TO).

Glossary (docs/method.md sections 1 and 3; vLLM rejection-sampler style):

    B              batch size: independent chains verified together.
    K              drafts per chain (gamma), K >= 1.
    V              vocabulary size.
    depth d        1..K, the draft position in a chain (index d-1 in tensors).
    draft_tokens   (B, K) int64, y_1..y_K: the tokens proposed by the draft (MTP head).
    draft_probs    (B, K, V): q_d, the distribution each draft was sampled from, after the SAME
                   temperature / top-k / top-p as the target (otherwise RS is biased).
    target_probs   (B, K+1, V): p_1..p_{K+1}, the target (policy) rows from one verification
                   forward over [x_{t+1}, y_1..y_K], already warped. p_{K+1} is for the bonus.
    accepted       a draft token that is kept.
    recovered      the token emitted at the first rejected depth d, drawn from the residual:
                   RS: norm(max(0, p_d - q_d)); TO: p_d with y_d removed, renormalised.
    bonus          the token drawn from p_{K+1} when all K drafts are accepted.
    num_accepted   (B,) int64 in [0, K]: accepted drafts per row; row b emits
                   num_accepted[b] + 1 tokens (accepted drafts, then one recovered or bonus).
    tokens         (B, K+1) int64: the emitted tokens, then -1 padding.

Rules (both lossless: emitted tokens are distributed exactly as sampling from the target alone):

    RS: accept y_d iff u_d * q_d(y_d) < p_d(y_d), u_d ~ U[0, 1) in float64. The comparison is
        strict, so a token with p_d(y_d) = 0 is never accepted, even when u_d = 0 (SGLang #35771).
    TO: drafts are argmax q (greedy). Accept y_d iff u_d < p_d(y_d), i.e. with probability
        p_d(y_d); otherwise emit a token from p_d with y_d removed.
    Left to right; stop at the first rejection. If the residual has no mass (RS: only when
    p_d == q_d up to rounding, where rejection has probability 0; TO: only when p_d is a point
    mass on y_d), the recovered token is drawn from p_d instead.

Random draws (exactly two generator calls, in this order; shapes depend only on B and K):

    uniforms = torch.rand((B, K), dtype=float64, generator=g, device=dev)   # u_d
    final    = torch.rand((B,), dtype=float64, generator=g, device=dev)     # the emitted token's draw

Only one recovered or bonus token per row is ever emitted, at position num_accepted: its weight row
(the residual at the first rejected depth, or p_{K+1} after K accepts) is gathered, and the token is
drawn from it by the inverse CDF (`inverse_cdf`: the first token whose float64 cumulative weight exceeds
final * sum(w)), so P(v) = w_v / sum(w) and an entry with w_v = 0 is never chosen. No (B, K+1, V) noise
or residual is made (vLLM's sampler draws the recovered token the same way, one draw per request), there
is no data-dependent Python branching and no host synchronisation: the batched functions equal a per-row
loop given the same draws (the loop reference lives in tests/test_acceptance.py).
"""

from __future__ import annotations

import torch

from bebop.errors import BebopError
from bebop.sampling.warp import inverse_cdf

__all__ = ["rejection_sample", "target_only_sample"]


# ---------------------------------------------------------------------------------------------
# Public API: validate, draw the randomness, call the pure functions.
# ---------------------------------------------------------------------------------------------


def rejection_sample(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    *,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lossless RS acceptance of sampled drafts.

    draft_tokens (B, K) int64, draft_probs (B, K, V), target_probs (B, K+1, V) ->
    (tokens (B, K+1) int64 with -1 padding, num_accepted (B,) int64 in [0, K]).
    """
    batch, k, _ = _validate(draft_tokens, target_probs, draft_probs)
    uniforms, final = _draw(batch, k, target_probs.device, generator)
    return _rejection_sample_from(draft_tokens, draft_probs, target_probs, uniforms, final)


def target_only_sample(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    *,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lossless TO acceptance of greedy drafts (argmax q; q itself is not needed).

    draft_tokens (B, K) int64, target_probs (B, K+1, V) ->
    (tokens (B, K+1) int64 with -1 padding, num_accepted (B,) int64 in [0, K]).
    """
    batch, k, _ = _validate(draft_tokens, target_probs, None)
    uniforms, final = _draw(batch, k, target_probs.device, generator)
    return _target_only_sample_from(draft_tokens, target_probs, uniforms, final)


def _draw(batch: int, k: int, device: torch.device, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The only randomness: uniforms (B, K) float64, then one final uniform (B,) float64 per row."""
    uniforms = torch.rand((batch, k), dtype=torch.float64, device=device, generator=generator)  # (B, K)
    final = torch.rand((batch,), dtype=torch.float64, device=device, generator=generator)  # (B,)
    return uniforms, final


def _validate(
    draft_tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor | None
) -> tuple[int, int, int]:
    """Cheap shape/dtype checks (no host sync). Returns (B, K, V)."""
    shapes = f"draft_tokens {tuple(draft_tokens.shape)}"
    if draft_probs is not None:
        shapes += f", draft_probs {tuple(draft_probs.shape)}"
    shapes += f", target_probs {tuple(target_probs.shape)}"
    expected = "expected draft_tokens (B, K), draft_probs (B, K, V), target_probs (B, K+1, V) with K >= 1"
    if draft_probs is None:
        expected = "expected draft_tokens (B, K), target_probs (B, K+1, V) with K >= 1"
    if draft_tokens.dim() != 2 or target_probs.dim() != 3 or (draft_probs is not None and draft_probs.dim() != 3):
        raise BebopError(f"bad shapes: {shapes}; {expected}")
    batch, k = draft_tokens.shape
    vocab = target_probs.shape[-1]
    if k < 1:
        raise BebopError(f"need at least one draft token (K >= 1): {shapes}")
    if target_probs.shape != (batch, k + 1, vocab):
        raise BebopError(f"shape mismatch: {shapes}; {expected}")
    if draft_probs is not None and draft_probs.shape != (batch, k, vocab):
        raise BebopError(f"shape mismatch: {shapes}; {expected}")
    if draft_tokens.dtype != torch.int64:
        raise BebopError(f"draft_tokens must be int64, got {draft_tokens.dtype}")
    if not target_probs.is_floating_point():
        raise BebopError(f"target_probs must be floating point, got {target_probs.dtype}")
    if draft_probs is not None and not draft_probs.is_floating_point():
        raise BebopError(f"draft_probs must be floating point, got {draft_probs.dtype}")
    if draft_probs is not None and draft_probs.device != target_probs.device:
        raise BebopError(f"draft_probs on {draft_probs.device} but target_probs on {target_probs.device}")
    if draft_tokens.device != target_probs.device:
        raise BebopError(f"draft_tokens on {draft_tokens.device} but target_probs on {target_probs.device}")
    return batch, k, vocab


# ---------------------------------------------------------------------------------------------
# Pure functions: all randomness injected; tests call these directly.
# ---------------------------------------------------------------------------------------------


def _rejection_sample_from(
    draft_tokens: torch.Tensor,  # (B, K) int64
    draft_probs: torch.Tensor,  # (B, K, V)
    target_probs: torch.Tensor,  # (B, K+1, V)
    uniforms: torch.Tensor,  # (B, K) float64 in [0, 1)
    final: torch.Tensor,  # (B,) float64 in [0, 1)
) -> tuple[torch.Tensor, torch.Tensor]:
    """RS with injected draws. Returns (tokens (B, K+1) int64, num_accepted (B,) int64)."""
    k = draft_tokens.shape[1]
    dtype = torch.promote_types(draft_probs.dtype, target_probs.dtype)
    index = draft_tokens.unsqueeze(-1)  # (B, K, 1)
    p_draft = target_probs[:, :k].gather(-1, index).squeeze(-1).to(dtype).double()  # (B, K) p_d(y_d)
    q_draft = draft_probs.gather(-1, index).squeeze(-1).to(dtype).double()  # (B, K) q_d(y_d)
    num_accepted = _accepted_prefix(uniforms.double() * q_draft < p_draft)  # strict
    at = num_accepted.clamp_max(k - 1)  # (B,) the first rejected depth (a placeholder after K accepts)
    p_at = _row_at(target_probs, at).to(dtype)  # (B, V) p_d at that depth
    residual = (p_at - _row_at(draft_probs, at).to(dtype)).clamp_min(0.0)  # (B, V) unnormalised max(0, p - q)
    return _finish(draft_tokens, num_accepted, residual, p_at, target_probs, final)


def _target_only_sample_from(
    draft_tokens: torch.Tensor,  # (B, K) int64
    target_probs: torch.Tensor,  # (B, K+1, V)
    uniforms: torch.Tensor,  # (B, K) float64 in [0, 1)
    final: torch.Tensor,  # (B,) float64 in [0, 1)
) -> tuple[torch.Tensor, torch.Tensor]:
    """TO with injected draws. Returns (tokens (B, K+1) int64, num_accepted (B,) int64)."""
    k = draft_tokens.shape[1]
    p_draft = target_probs[:, :k].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1).double()  # (B, K) p_d(y_d)
    num_accepted = _accepted_prefix(uniforms.double() < p_draft)  # strict
    at = num_accepted.clamp_max(k - 1)  # (B,)
    p_at = _row_at(target_probs, at)  # (B, V)
    residual = p_at.scatter(-1, draft_tokens.gather(1, at[:, None]), 0.0)  # (B, V) p_d with y_d removed
    return _finish(draft_tokens, num_accepted, residual, p_at, target_probs, final)


def _accepted_prefix(accepted: torch.Tensor) -> torch.Tensor:
    """accepted (B, K) bool, the test at every depth -> (B,) int64: accepted drafts before the first rejection."""
    return accepted.long().cumprod(dim=1).sum(dim=1)


def _row_at(rows: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """rows (B, D, V), at (B,) int64 -> (B, V): each batch row's row at its own depth index."""
    return rows.gather(1, at[:, None, None].expand(-1, 1, rows.shape[-1])).squeeze(1)


def _finish(
    draft_tokens: torch.Tensor,  # (B, K) int64
    num_accepted: torch.Tensor,  # (B,) int64 in [0, K]
    residual: torch.Tensor,  # (B, V) unnormalised recovery weights at the first rejected depth
    p_at: torch.Tensor,  # (B, V) the target row at that depth (the fallback when the residual has no mass)
    target_probs: torch.Tensor,  # (B, K+1, V)
    final: torch.Tensor,  # (B,) float64 in [0, 1)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Shared tail: draw the recovered (first rejection) or bonus (K accepts) token, pad with -1."""
    batch, k = draft_tokens.shape
    has_mass = (residual > 0).any(dim=-1, keepdim=True)  # (B, 1)
    recover = torch.where(has_mass, residual, p_at.to(residual.dtype))  # (B, V)
    bonus = target_probs[:, -1].to(residual.dtype)  # (B, V) p_{K+1} (an index from the end keeps K dynamic)
    weights = torch.where((num_accepted == k)[:, None], bonus, recover)  # (B, V)
    emitted = inverse_cdf(weights, final)  # (B,) int64

    positions = torch.arange(k + 1, device=draft_tokens.device).unsqueeze(0)  # (1, K+1)
    drafts_padded = torch.cat([draft_tokens, draft_tokens.new_full((batch, 1), -1)], dim=1)  # (B, K+1)
    n = num_accepted.unsqueeze(1)  # (B, 1)
    tokens = torch.where(positions < n, drafts_padded, torch.where(positions == n, emitted[:, None], -1))  # (B, K+1)
    return tokens, num_accepted
