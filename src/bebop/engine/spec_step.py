"""The two verbs of a speculative step as pure tensor functions: the drafting chain and the verify, and the step.

    draws = step_draws(rows, k, generator, device)                # (R, 2k + 2) float64: the step's randomness
    drafts, draft_probs = draft_chain(model, head_cache, ref_hidden, ref_tokens, ref_count, draws[:, :k],
                                      k=k, mode="rs", sampling=params)
    hidden, host = verify(model, cache, ids, counts, is_draft, drafts, draft_probs, draws[:, k:],
                          k=k, mode="rs", sampling=params)
    hidden, host = speculative_step(model, cache, head_cache, ref_hidden, ref_tokens, ref_count, ids, counts,
                                    is_draft, draws, k=k, mode="rs", sampling=params)   # the two in one call

Each is a fixed sequence of tensor operations with no host synchronisation and no data-dependent
Python, so the engine runs it eagerly or compiled (bebop.engine.compiled), and both paths compute the
same thing from the same modules. A decode step drafting with the head compiles whole
(`speculative_step`: one graph per k, its host work one call); the verbs compile on their own too (the
batch, the caches' spans, the refresh width and the verify's k dynamic), so that a drafter other than
the head (a test's oracle, a suffix index) can take draft_chain's place while the verify stays
compiled, and a catch-up refresh wider than a decode step's runs its own graph.

Random numbers: one float64 uniform tensor per step, drawn up front (`step_draws`), columns in order:

    [0, k)          draft_chain: depth d's draft y_d = inverse_cdf(q_d, u) (RS; TO takes argmax q_d)
    k               verify: the plain token of a row that does not draft, inverse_cdf(p_1, u)
    [k + 1, 2k + 1) verify: the acceptance test of depth d (sampling/acceptance.py's `uniforms`)
    2k + 1          verify: the emitted recovered / bonus token's draw (acceptance.py's `final`)

Inverse-CDF sampling from a given uniform draws each token exactly from its distribution (a token of
mass 0 has an empty interval), so every draw is what a generator call would have made, in a documented
order; at temperature 0 every draw is an argmax and the uniforms are unused.

`verify` returns the step's per-row results as one (R, 3(k+1) + 2) float64 tensor, read by the host
once: emitted tokens (k+1, -1 padded), their log-probs (k+1), the target entropies (k+1), the accepted
draft count, and whether the row's logits (and draft distributions) were finite.
"""

from __future__ import annotations

import torch

from bebop.model.kv_cache import KVCache
from bebop.model.qwen3 import CausalLM
from bebop.sampling import SamplingParams, entropy, warp_probs
from bebop.sampling.acceptance import _rejection_sample_from, _target_only_sample_from
from bebop.sampling.warp import inverse_cdf, pack_host


def step_draws(rows: int, k: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """The step's randomness: (R, 2k + 2) float64 uniforms in [0, 1), laid out as the module docstring says."""
    return torch.rand((rows, 2 * k + 2), dtype=torch.float64, device=device, generator=generator)


def _pick(probs: torch.Tensor, draws: torch.Tensor, greedy: bool) -> torch.Tensor:
    """probs (R, V), draws (R,) -> tokens (R,): argmax at temperature 0 (probs one-hot), else the inverse CDF."""
    return probs.argmax(-1) if greedy else inverse_cdf(probs, draws)


def draft_refresh(model: CausalLM, head_cache: KVCache, ref_hidden: torch.Tensor, ref_tokens: torch.Tensor,
                  ref_count: torch.Tensor, draws: torch.Tensor, *, mode: str,
                  sampling: SamplingParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The head's refresh over each row's pending positions, whose last gives depth 1's draft.

    ref_hidden (R, W, H), ref_tokens (R, W), ref_count (R,) >= 1 (left-aligned), draws (R,) -> the depth-1 output
    hidden (R, H), draft (R,) int64, its distribution q_1 (R, V) float32."""
    rows = ref_hidden.shape[0]
    out = head_forward(model, head_cache, ref_hidden, ref_tokens, ref_count)  # (R, W, H)
    hidden = out[torch.arange(rows, device=out.device), (ref_count - 1).clamp_min(0)]  # (R, H)
    return _draft_from(model, hidden, draws, mode, sampling)


def head_forward(model: CausalLM, head_cache: KVCache, ref_hidden: torch.Tensor, ref_tokens: torch.Tensor,
                 ref_count: torch.Tensor) -> torch.Tensor:
    """The head's depth-1 forward over each row's first ref_count positions, written into `head_cache`: its input
    at position s is (the trunk's h_s, the token x_{s+1}). ref_hidden (R, W, H), ref_tokens (R, W) -> (R, W, H)."""
    return model.require_mtp()(ref_hidden, model.embed(ref_tokens), 1, head_cache, ref_count)


def draft_next(model: CausalLM, head_cache: KVCache, hidden: torch.Tensor, token: torch.Tensor, draws: torch.Tensor,
               *, depth: int, mode: str, sampling: SamplingParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One drafting forward at `depth` >= 2: hidden (R, H) and token (R,) of the depth before, draws (R,) ->
    this depth's hidden (R, H), draft (R,), q_depth (R, V)."""
    ones = torch.ones(hidden.shape[0], dtype=torch.long, device=hidden.device)  # (R,)
    out = model.require_mtp()(hidden[:, None], model.embed(token[:, None]), depth, head_cache, ones)  # (R, 1, H)
    return _draft_from(model, out[:, 0], draws, mode, sampling)


def _draft_from(model: CausalLM, hidden: torch.Tensor, draws: torch.Tensor, mode: str,
                sampling: SamplingParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q = warp_probs(model.mtp_logits(hidden), sampling)  # (R, V)
    return hidden, _pick(q, draws, sampling.greedy or mode != "rs"), q


def draft_chain(model: CausalLM, head_cache: KVCache, ref_hidden: torch.Tensor, ref_tokens: torch.Tensor,
                ref_count: torch.Tensor, draws: torch.Tensor, *, k: int, mode: str,
                sampling: SamplingParams, refresh=draft_refresh, step=draft_next) -> tuple[torch.Tensor, torch.Tensor]:
    """Refresh the head's cache with each row's pending positions, draft k tokens.

    ref_hidden (R, W, H), ref_tokens (R, W), ref_count (R,) >= 1: each row's positions waiting for the head
    (left-aligned); draws (R, k) -> drafts (R, k) int64, draft_probs (R, k, V) float32. The head cache's lengths are
    left at their start + ref_count: the drafting forwards' entries are dropped (a length change; its host span is
    the engine's to set). `refresh`, `step`: draft_refresh and draft_next or functions computing the same (the
    compiled ones)."""
    rows = ref_hidden.shape[0]
    column = draws[:, 0] if k else draws.new_zeros(rows)  # (R,): k = 0 refreshes alone, its draft unused
    hidden, token, q = refresh(model, head_cache, ref_hidden, ref_tokens, ref_count, column, mode=mode,
                               sampling=sampling)
    if not k:
        return ref_tokens.new_zeros(rows, 0), q.new_zeros(rows, 0, model.config.vocab_size)
    tokens, probs = [token], [q]  # (R,), (R, V) per depth
    for depth in range(2, k + 1):
        hidden, token, q = step(model, head_cache, hidden, token, draws[:, depth - 1], depth=depth, mode=mode,
                                sampling=sampling)
        tokens.append(token)
        probs.append(q)
    if k > 1:
        head_cache.lengths.sub_(k - 1)  # (R,): the drafting forwards' positions, one a depth from 2
    return torch.stack(tokens, dim=1), torch.stack(probs, dim=1)


def verify(model: CausalLM, cache: KVCache, ids: torch.Tensor, counts: torch.Tensor, is_draft: torch.Tensor,
           drafts: torch.Tensor, draft_probs: torch.Tensor, draws: torch.Tensor, *, k: int, mode: str,
           sampling: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """One trunk forward and the acceptance: drafting rows feed [x_last, y_1..y_k], the others their pending
    tokens, and every row gets its emitted tokens. The cache keeps each row's verified positions: a drafting row's
    rejected drafts are dropped (a length change), the rest of its chunk and every other row's stay.

    ids (R, Wc) with Wc >= k + 1 where a row drafts (its draft slots are overwritten here), counts (R,) tokens
    fed per row (k + 1 for a drafting row), is_draft (R,) bool, drafts (R, k), draft_probs (R, k, V),
    draws (R, k + 2) -> hidden (R, Wc, H), host (R, 3(k+1) + 2) float64 (module docstring)."""
    rows = ids.shape[0]
    device = ids.device
    assert drafts.shape[1] == k, (drafts.shape, k)  # a compiled graph passes its (dynamic) width here
    if k:
        ids = torch.cat([ids[:, :1], torch.where(is_draft[:, None], drafts, ids[:, 1:k + 1]), ids[:, k + 1:]], dim=1)
    hidden = model(ids, cache, counts)  # (R, Wc, H)
    last = (counts - 1).clamp_min(0)  # (R,)
    positions = torch.where(is_draft[:, None], torch.arange(k + 1, device=device), last[:, None])  # (R, k+1)
    logits = model.logits(hidden[torch.arange(rows, device=device)[:, None], positions])  # (R, k+1, V)
    target_probs = warp_probs(logits, sampling)  # (R, k+1, V)
    plain = _pick(target_probs[:, 0], draws[:, 0], sampling.greedy)  # (R,)
    tokens = torch.cat([plain[:, None], plain.new_full((rows, k), -1)], dim=1)  # (R, k+1)
    accepted = torch.zeros(rows, dtype=torch.long, device=device)  # (R,)
    if k:
        if mode == "rs":
            spec_tokens, spec_accepted = _rejection_sample_from(drafts, draft_probs, target_probs, draws[:, 1:k + 1],
                                                                draws[:, -1])
        else:
            spec_tokens, spec_accepted = _target_only_sample_from(drafts, target_probs, draws[:, 1:k + 1],
                                                                  draws[:, -1])
        tokens = torch.where(is_draft[:, None], spec_tokens, tokens)
        accepted = torch.where(is_draft, spec_accepted, accepted)
        cache.lengths.sub_(torch.where(is_draft, k - accepted, 0))  # (R,): the rejected drafts' positions
    logprobs = torch.log(target_probs.gather(-1, tokens.clamp_min(0)[..., None])[..., 0])  # (R, k+1)
    host = pack_host([tokens, logprobs, entropy(target_probs), accepted], logits, draft_probs)  # (R, 3(k+1) + 2)
    return hidden, host


def speculative_step(model: CausalLM, cache: KVCache, head_cache: KVCache, ref_hidden: torch.Tensor,
                     ref_tokens: torch.Tensor, ref_count: torch.Tensor, ids: torch.Tensor, counts: torch.Tensor,
                     is_draft: torch.Tensor, draws: torch.Tensor, *, k: int, mode: str, sampling: SamplingParams,
                     chain=draft_chain, check=verify) -> tuple[torch.Tensor, torch.Tensor]:
    """A step drafting with the head: its drafting chain, then the verify of the drafts.

    ref_hidden (R, W, H), ref_tokens (R, W), ref_count (R,) as draft_chain's; ids (R, Wc), counts (R,), is_draft (R,)
    as verify's; draws (R, 2k + 2) (the module docstring's columns) -> hidden (R, Wc, H), host (R, 3(k+1) + 2).
    `chain`, `check`: draft_chain and verify or functions computing the same (the compiled ones); compiled whole, the
    step is one graph."""
    drafts, draft_probs = chain(model, head_cache, ref_hidden, ref_tokens, ref_count, draws[:, :k], k=k, mode=mode,
                                sampling=sampling)  # (R, k), (R, k, V)
    return check(model, cache, ids, counts, is_draft, drafts, draft_probs, draws[:, k:], k=k, mode=mode,
                 sampling=sampling)
