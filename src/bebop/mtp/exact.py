"""The expected acceptance of an MTP head on given sequences (docs/method.md section 8): the estimator behind
`bebop mtp diagnose` and the loss study's exact measure.

    chains = expected_chains(model, sequences, depth=8, sampling=SamplingParams(1.0), generator=g)
    chains.rs_reach[i]   # (N_i, D): at each drafting step start of sequence i, P(drafts 1..d accepted | sequence), RS
    chains.to_reach[i]   # (N_i, D): the same under TO

A drafting step starts where the engine's does: the last emitted token x_{t+1} is a response token (the
first one is sampled plainly after the prompt's prefill) that is not the response's last. At each start the
trunk reads the real prefix x_0..x_{t+1} and the head refreshes over it as the engine's head does, giving p_1
and q_1: for an attention-only trunk one prefill of the sequence serves all its starts (its caches copied and
cut back to each prefix's length); a hybrid's recurrent states cannot be cut back, so its starts are a ragged
prefill of their prefixes each. The chain then follows the tokens that actually came next (the sequences are
the target's own samples), and the reach through depth d is the conditional probability, given them, that
the engine's step accepted drafts 1..d: prod_{i<=d} m_i with
- RS: m_i = min(p_i, q_i)(x) / p_i(x) at the realised token x (an accepted draft is distributed as
  min(p, q), a rejection emits from (p - q)+, and the two add up to p);
- TO: m_i = [x = argmax q_i] (the engine accepts its greedy draft exactly when the target's sample equals it).
Past the sequence's end (a step near the end still verifies K drafts) the chain goes on along the head's law
of an accepted draft, y ~ min(p, q) / alpha under RS and the argmax under TO, multiplying alpha_i =
sum_v min(p_i, q_i) (TO: p_i(argmax q_i)): unbiased, its only noise the chain's sampling.

p and q are warped as the engine warps them (temperature, top-k, top-p). Also kept per start: H(p_1),
TV(p_1, q_1) and p_1(argmax q_1) (the entropy law and the RS-beats-TO share, expectations over the next token)
and, per depth along the RS chain, the draft diagnostics' fields (bebop.mtp.draft_stats.row_diagnostics)
weighted by the reach before that depth.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from bebop.model.host_tensor import pad_chunk
from bebop.model.kv_cache import KVCache
from bebop.model.qwen3 import CausalLM
from bebop.mtp.draft_stats import FIELDS, row_diagnostics
from bebop.sampling import SamplingParams, entropy, sample, warp_probs


@dataclass
class Chains:
    """Per sequence i, per drafting step start: the reach probabilities (N_i, D) under RS and TO, depth-1
    quantities (N_i,), and sums over starts of the RS chain's diagnostics weighted by reach (D, len(FIELDS))."""

    depth: int
    rs_reach: list[torch.Tensor] = field(default_factory=list)  # (N_i, D) float64 each
    to_reach: list[torch.Tensor] = field(default_factory=list)  # (N_i, D)
    entropy_1: list[torch.Tensor] = field(default_factory=list)  # (N_i,) H(p_1) nats
    tv_1: list[torch.Tensor] = field(default_factory=list)  # (N_i,) TV(p_1, q_1)
    to_1: list[torch.Tensor] = field(default_factory=list)  # (N_i,) p_1(argmax q_1)
    diag_sum: torch.Tensor | None = None  # (D, F): sum over starts of reach_{d-1} * diagnostics at depth d
    diag_weight: torch.Tensor | None = None  # (D,): sum over starts of reach_{d-1}

    @property
    def starts(self) -> int:
        return sum(len(r) for r in self.rs_reach)


@dataclass(frozen=True)
class _Start:
    seq: int  # which sequence
    length: int  # of its prefix x_0..x_{t+1}: the prompt and the response up to the last emitted token


def drafting_starts(sequences: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[_Start]:
    """(prompt_ids, response_ids) pairs -> every drafting step start (see the module text), in sequence order."""
    return [_Start(i, len(prompt) + j + 1) for i, (prompt, response) in enumerate(sequences)
            for j in range(len(response) - 1)]


COLUMNS = ("rs_reach", "to_reach", "entropy_1", "tv_1", "to_1")  # Chains' per-start fields
ESTIMATOR = "realised-tokens"  # how the chains weigh a start: part of every cached measure's key


@torch.inference_mode()
def expected_chains(model: CausalLM, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], *, depth: int,
                    sampling: SamplingParams, generator: torch.Generator | None = None, batch_size: int = 64,
                    pad_id: int = 0, progress: Callable[[int], object] | None = None) -> Chains:
    """The chains of every drafting step start of `sequences` ((prompt_ids, response_ids) pairs), up to `depth`.
    `progress(n)` is called after each batch of n starts."""
    model.require_mtp()
    starts = drafting_starts(sequences)
    full = [list(prompt) + list(response) for prompt, response in sequences]
    columns = {name: torch.zeros((len(starts), depth) if name.endswith("reach") else len(starts), dtype=torch.float64)
               for name in COLUMNS}  # (N, D) or (N,), every start in sequence order
    diag_sum = torch.zeros(depth, len(FIELDS), dtype=torch.float64)
    diag_weight = torch.zeros(depth, dtype=torch.float64)
    shared = not model.config.linear_layers  # attention-only: a prefix is a length in a copied cache
    for idx in _batches(starts, batch_size, shared):
        prefixes = [full[starts[j].seq][: starts[j].length] for j in idx]
        opened = _open_shared(model, prefixes, depth) if shared else _open_ragged(model, prefixes, depth, pad_id)
        realised = _realised(full, [starts[j] for j in idx], depth, model.device)  # (B, D)
        rows = _chain_batch(model, opened, realised, sampling, generator)
        diag_sum += rows["diag_sum"]
        diag_weight += rows["diag_weight"]
        for name, column in columns.items():
            column[idx] = rows[name].double()
        if progress:
            progress(len(idx))
    per_seq = [max(0, len(response) - 1) for _, response in sequences]  # starts of each sequence
    return Chains(depth, **{name: list(column.split(per_seq)) for name, column in columns.items()},
                  diag_sum=diag_sum, diag_weight=diag_weight)


def _batches(starts: list[_Start], batch_size: int, shared: bool) -> list[list[int]]:
    """Batches of start indices: with a shared prefill (attention-only trunks), runs of one sequence's starts;
    else starts of similar prefix lengths (a ragged prefill pads to the longest)."""
    if shared:
        by_seq: dict[int, list[int]] = {}
        for j, st in enumerate(starts):
            by_seq.setdefault(st.seq, []).append(j)
        return [ids[lo: lo + batch_size] for ids in by_seq.values() for lo in range(0, len(ids), batch_size)]
    order = sorted(range(len(starts)), key=lambda j: starts[j].length)
    return [order[lo: lo + batch_size] for lo in range(0, len(order), batch_size)]


@dataclass
class _Opened:
    """B starts after the prefill and the head's refresh, each row twice (RS rows 0..B-1, TO rows B..2B-1)."""

    cache: KVCache  # the trunk's (a HybridCache for a hybrid), 2B rows, at each prefix's length
    mtp_cache: KVCache  # the head's (2B rows), at each prefix's length - 1
    h_trunk: torch.Tensor  # (2B, H): the trunk's hidden at x_{t+1} (p_1 reads it)
    h_head: torch.Tensor  # (2B, H): the refresh's output at position t (q_1 reads it)


def _open_ragged(model: CausalLM, prefixes: list[list[int]], depth: int, pad_id: int) -> _Opened:
    """Any trunk (hybrids too): one ragged prefill of the B prefixes."""
    device = model.device
    b = len(prefixes)
    ids, counts = pad_chunk(prefixes, pad_id, device)  # (B, W), (B,)
    capacity = ids.shape[1] + depth + 1
    cache = model.new_cache(b, capacity)
    hidden = model(ids, cache, counts)  # (B, W, H)
    mtp = model.require_mtp()
    mtp_cache = mtp.new_cache(b, capacity, dtype=model.dtype, device=device)
    refresh_ids, _ = pad_chunk([p[1:] for p in prefixes], pad_id, device)  # (B, W-1): x_{s+1} for s = 0..t
    head_out = mtp(hidden[:, :-1], model.embed(refresh_ids), 1, mtp_cache, counts - 1)  # (B, W-1, H)
    rows = torch.arange(b, device=device)
    last = counts - 1  # (B,) position t+1 of x_{t+1}
    both = torch.cat([rows, rows])  # (2B,)
    cache.keep(both, span=int(counts.max()))
    mtp_cache.keep(both, span=int(counts.max()) - 1)
    return _Opened(cache, mtp_cache, hidden[rows, last][both], head_out[rows, last - 1][both])


def _open_shared(model: CausalLM, prefixes: list[list[int]], depth: int) -> _Opened:
    """An attention-only trunk and prefixes of ONE sequence: prefill and refresh the longest once, copy the caches
    to 2B rows and cut each row back to its prefix (a length, no copy): O(L) forwards for L starts, not O(L^2)."""
    device = model.device
    longest = max(prefixes, key=len)
    ids = torch.tensor([longest], device=device)  # (1, W)
    capacity = ids.shape[1] + depth + 1
    cache = model.new_cache(1, capacity)
    hidden = model(ids, cache)  # (1, W, H)
    mtp = model.require_mtp()
    mtp_cache = mtp.new_cache(1, capacity, dtype=model.dtype, device=device)
    head_out = mtp(hidden[:, :-1], model.embed(ids[:, 1:]), 1, mtp_cache,
                   torch.tensor([ids.shape[1] - 1], device=device))  # (1, W-1, H)
    lengths = torch.tensor([len(p) for p in prefixes] * 2, device=device)  # (2B,)
    zeros = torch.zeros(len(lengths), dtype=torch.long, device=device)
    cache.keep(zeros, span=ids.shape[1])
    cache.rollback(lengths, span=int(lengths.max()))
    mtp_cache.keep(zeros, span=ids.shape[1] - 1)
    mtp_cache.rollback(lengths - 1, span=int(lengths.max()) - 1)
    return _Opened(cache, mtp_cache, hidden[0, lengths - 1], head_out[0, lengths - 2])


def _realised(full: list[list[int]], starts: list[_Start], depth: int, device: torch.device) -> torch.Tensor:
    """The tokens that followed each start in its sequence, depth by depth: (B, D), -1 past the sequence's end."""
    out = torch.full((len(starts), depth), -1, dtype=torch.long)
    for b, st in enumerate(starts):
        after = full[st.seq][st.length: st.length + depth]
        out[b, : len(after)] = torch.tensor(after, dtype=torch.long)
    return out.to(device)


def _chain_batch(model: CausalLM, opened: _Opened, realised: torch.Tensor, sampling: SamplingParams,
                 generator: torch.Generator | None) -> dict:
    """One batch of B starts, opened: the RS chains on rows 0..B-1, the TO chains on rows B..2B-1, each along the
    sequence's own tokens `realised` (B, D) while it lasts and along the head's law of an accepted draft after it."""
    device = model.device
    cache, mtp_cache, h_trunk, h_head = opened.cache, opened.mtp_cache, opened.h_trunk, opened.h_head
    b, depth = realised.shape
    mtp = model.require_mtp()
    reach = torch.ones(2 * b, dtype=torch.float64, device=device)
    rs_reach, to_reach, first = [], [], {}
    diag_sum = torch.zeros(depth, len(FIELDS), dtype=torch.float64)
    diag_weight = torch.zeros(depth, dtype=torch.float64)
    ones = torch.ones(2 * b, dtype=torch.long, device=device)
    for d in range(1, depth + 1):
        p = warp_probs(model.logits(h_trunk), sampling)  # (2B, V)
        q = warp_probs(model.mtp_logits(h_head), sampling)  # (2B, V)
        overlap = torch.minimum(p[:b], q[:b])  # (B, V): the law of an accepted RS draft, unnormalised
        alpha_rs = overlap.sum(-1)  # (B,)
        guess = q[b:].argmax(-1)  # (B,) TO's draft
        alpha_to = p[b:].gather(-1, guess[:, None])[:, 0]  # (B,)
        diag = row_diagnostics(torch.log(q[:b].clamp_min(1e-38))[:, None], p[:b, None])[:, 0].double().cpu()  # (B, F)
        weight = reach[:b].cpu()
        diag_sum[d - 1] += (weight[:, None] * diag).sum(0)
        diag_weight[d - 1] += weight.sum()
        if d == 1:
            first = {"entropy_1": entropy(p[:b]), "tv_1": 1 - alpha_rs, "to_1": alpha_to}
        x = realised[:, d - 1]  # (B,) the token that followed, -1 past the end
        seen = x >= 0
        token = x.clamp_min(0)
        reach = reach * torch.cat([torch.where(seen, rs_realised(p[:b], q[:b], token), alpha_rs),
                                   torch.where(seen, to_realised(p[b:], guess, token), alpha_to)]).double()
        rs_reach.append(reach[:b])
        to_reach.append(reach[b:])
        if d == depth:
            break
        accepted = torch.where(alpha_rs[:, None] > 0, overlap, p[:b])  # unreachable rows: any token
        drawn = sample(accepted / accepted.sum(-1, keepdim=True), generator)  # (B,) an accepted draft's law
        y = torch.cat([torch.where(seen, x, drawn), torch.where(seen, x, guess)])  # (2B,)
        h_trunk = model(y[:, None], cache, ones)[:, 0]  # (2B, H)
        h_head = mtp(h_head[:, None], model.embed(y[:, None]), d + 1, mtp_cache, ones)[:, 0]  # (2B, H)
    return {"rs_reach": torch.stack(rs_reach, 1).cpu(), "to_reach": torch.stack(to_reach, 1).cpu(),
            **{k: v.cpu() for k, v in first.items()}, "diag_sum": diag_sum, "diag_weight": diag_weight}


def rs_realised(target_probs: torch.Tensor, draft_probs: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """P(the RS draft at this depth is accepted | the token that followed is `token`): min(p, q)(x) / p(x) (an
    accepted draft is distributed as min(p, q), a rejection emits from (p - q)+, and the two add up to p). A token
    the target gives no mass cannot have come from this engine: it counts as a rejection.

    target_probs, draft_probs (B, V); token (B,) -> (B,)"""
    p_x = target_probs.gather(-1, token[:, None])[:, 0]  # (B,)
    q_x = draft_probs.gather(-1, token[:, None])[:, 0]  # (B,)
    return torch.where(p_x > 0, torch.minimum(p_x, q_x) / p_x.clamp_min(1e-38), torch.zeros_like(p_x))


def to_realised(target_probs: torch.Tensor, guess: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """The same under TO: [x = guess] (the engine accepts its greedy draft exactly when the target's sample
    equals it), 0 where the target gives x no mass. target_probs (B, V); guess, token (B,) -> (B,)"""
    p_x = target_probs.gather(-1, token[:, None])[:, 0]  # (B,)
    return ((p_x > 0) & (guess == token)).to(p_x.dtype)
