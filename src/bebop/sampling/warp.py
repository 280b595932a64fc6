"""Logits -> the distribution actually sampled from, and sampling from it.

`warp_probs` applies temperature, then top-k, then top-p (the order of vLLM and Hugging Face),
and returns probabilities in float32. Temperature 0 returns the one-hot of the argmax, so greedy
decoding is sampling from a point mass: one code path, log-prob 0, entropy 0.

Randomness always comes from an explicit `torch.Generator`; None means torch's global one.
"""

from __future__ import annotations

import torch

from bebop.errors import BebopError
from bebop.sampling.params import SamplingParams


def warp_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits (..., V) -> probs (..., V) float32, rows summing to 1."""
    if params.greedy:
        top = logits.float().argmax(dim=-1, keepdim=True)
        return torch.zeros_like(logits, dtype=torch.float32).scatter_(-1, top, 1.0)
    return torch.softmax(warp_logits(logits, params), dim=-1)


def warp_logits(logits: torch.Tensor, params: SamplingParams, fill: float = float("-inf")) -> torch.Tensor:
    """logits (..., V) -> float32 logits / temperature with the tokens that top-k and top-p drop set
    to `fill` (..., V): its softmax is the distribution sampled from (temperature > 0). Which tokens
    are dropped is a function of the values only (no gradient flows through the choice), so the RL
    trainer takes its log-probs from this same function (a finite `fill`, so that a token outside
    its current set has log-prob ~fill instead of -inf and a zero importance weight)."""
    logits = logits.float() / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits.detach(), params.top_k, dim=-1).values[..., -1:]  # (..., 1)
        logits = logits.masked_fill(logits.detach() < kth, fill)
    if params.top_p < 1.0:
        keep = _top_p_keep(torch.softmax(logits.detach(), dim=-1), params.top_p)  # (..., V)
        logits = logits.masked_fill(~keep, fill)
    return logits


def _top_p_keep(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The smallest set of most likely tokens whose mass reaches top_p (..., V) bool."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)  # (..., V)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of strictly better tokens
    keep_sorted = mass_before < top_p  # the first token is always kept
    return torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)


NONFINITE_MESSAGE = "logits contain NaN or inf (a diverged or corrupt model?)"


def to_host(columns: list[torch.Tensor], *checked: torch.Tensor) -> list[list[float]]:
    """The decoding loops' single device->host transfer per step: the per-row columns (B, *)
    as float64 lists, with the finiteness of the `checked` tensors (B, ...) in the same transfer."""
    return read_host(pack_host(columns, *checked))


def pack_host(columns: list[torch.Tensor], *checked: torch.Tensor) -> torch.Tensor:
    """The per-row columns (B, *) and the finiteness of the `checked` tensors (B, ...) as one (B, C + 1) float64
    tensor, the last column 1.0 where the row is finite (no host sync: a compiled step returns it)."""
    batch = columns[0].shape[0]
    finite = torch.stack([torch.isfinite(t).reshape(batch, -1).all(dim=1) for t in checked]).all(0)[:, None]  # (B, 1)
    return torch.cat([c.reshape(batch, -1).double() for c in columns] + [finite.double()], dim=1)


def read_host(packed: torch.Tensor) -> list[list[float]]:
    """A `pack_host` tensor (B, C + 1) -> its rows' columns as float64 lists, the step's one host sync; a row that
    is not finite raises."""
    rows = packed.tolist()
    if not all(row[-1] for row in rows):
        raise BebopError(NONFINITE_MESSAGE)
    return [row[:-1] for row in rows]


def sample(probs: torch.Tensor, generator: torch.Generator | None = None, *, greedy: bool = False) -> torch.Tensor:
    """probs (..., V) -> token ids (...) int64, one draw per row by the inverse CDF (`inverse_cdf`) with one
    float64 uniform a row instead of V exponentials (at V = 32k and 64 rows: 69 -> ~15 ms), no host sync.

    `greedy=True` (probs are one-hot, from temperature 0) takes the argmax: same result, no draw."""
    if greedy:
        return probs.argmax(dim=-1)
    uniforms = torch.rand(probs.shape[:-1], dtype=torch.float64, device=probs.device, generator=generator)  # (...)
    return inverse_cdf(probs, uniforms)


def inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """weights (..., V) >= 0 unnormalised, uniforms (...) float64 in [0, 1) -> token ids (...) int64 with
    P(v) = w_v / sum(w): the first token whose float64 cumulative weight exceeds u * sum(w). A token of weight 0
    has an empty interval and is never picked, nor is any token past the last one with weight (u * sum(w) can
    round up to sum(w)); a row with NaN gives an index in range, the finiteness check reports it."""
    cdf = weights.cumsum(dim=-1, dtype=torch.float64)  # (..., V)
    total = cdf[..., -1:].contiguous()  # (..., 1)
    picked = torch.searchsorted(cdf, uniforms[..., None] * total, right=True)  # (..., 1): first index with cdf > u
    last = torch.searchsorted(cdf, total)  # (..., 1): the first index reaching the total, the last with weight
    return torch.minimum(picked, last).clamp_max(weights.shape[-1] - 1).squeeze(-1)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """probs (..., V) -> H(probs) (...) in nats, with 0 log 0 = 0."""
    logp = torch.log(probs.clamp_min(torch.finfo(probs.dtype).tiny))
    return -(probs * logp).sum(dim=-1)


def token_logprob(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """probs (..., V), tokens (...) -> log probs(token) (...); -inf where the token has mass 0."""
    picked = probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return torch.log(picked)
