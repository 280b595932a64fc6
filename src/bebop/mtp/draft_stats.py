"""The per-position statistics of a draft q against its target p (what bebop.mtp.diagnostics reports per depth
and bebop.mtp.exact keeps along its chains): KL(p || q), H(q) - H(p), alpha = sum_v min(p, q) and its split
into the under-proposed (p > q) and over-proposed (q >= p) tokens' mass."""

from __future__ import annotations

import torch

FIELDS = ("kl", "entropy_gap", "alpha", "alpha_p_gt_q", "alpha_q_gt_p")


def row_diagnostics(draft_logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """(N, D, V) logits of q, (N, D, V) p -> (N, D, 5): kl, entropy gap, alpha, alpha_{p>q}, alpha_{q>p}."""
    log_q = torch.log_softmax(draft_logits.float(), dim=-1)
    q, p = log_q.exp(), target_probs.float()
    log_p = torch.log(p.clamp_min(1e-30))
    kl = (p * (log_p - log_q)).sum(-1)
    gap = -(q * log_q).sum(-1) + (p * log_p).sum(-1)  # H(q) - H(p)
    under = p > q
    a_pq = torch.where(under, q, torch.zeros_like(q)).sum(-1)
    a_qp = torch.where(under, torch.zeros_like(p), p).sum(-1)
    return torch.stack([kl, gap, a_pq + a_qp, a_pq, a_qp], dim=-1)
