"""Batched lossless speculative generation with an MTP draft head (method.md section 3).

    gens, metrics = speculative_generate(model, prompts, k=3, mode="rs", max_new_tokens=128,
                                         sampling=SamplingParams(1.0), stop_ids=[eos], generator=g)

One step, for every unfinished row at once:
  1. refresh + draft: the MTP head consumes the trunk hiddens of the tokens the last step made
     valid (a ragged chunk; its last position gives depth 1), then drafts depths 2..K one token
     at a time. RS samples y_d ~ q_d; TO takes argmax q_d.
  2. verify: ONE trunk forward over [x_last, y_1..y_K] gives the target rows p_1..p_{K+1}.
  3. accept with `rejection_sample` or `target_only_sample` (lossless), emit 1..K+1 tokens;
     stop tokens and max_new_tokens truncate inside the accepted run (RowBook).
  4. roll both caches back to the valid lengths (a length change, no copy).
A row whose next input is an environment observation (agent task) feeds it as a prefill in the
same verify forward and samples plainly for that step; drafting resumes on the next step.
Exactly one device->host transfer per step (the emitted tokens and their log-probs).

Seeds: as in plain generation, one generator serves the whole batch, so output is reproducible
for a given seed, prompts, batch and settings; at temperature 0 it equals plain greedy decoding
token for token, whatever the head.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from bebop.engine.generate import cache_capacity, check_prompts, pad_chunk
from bebop.engine.metrics import SpecMetrics
from bebop.engine.records import Generation
from bebop.engine.rows import Observer, RowBook
from bebop.errors import BebopError
from bebop.model.qwen3 import CausalLM
from bebop.sampling import (SamplingParams, entropy, rejection_sample, sample, target_only_sample, to_host,
                            warp_probs)

SPEC_MODES = ("to", "rs")
MAX_K = 8


def check_spec(mode: str, k: int) -> None:
    if mode not in SPEC_MODES:
        raise BebopError(f"unknown speculative mode {mode!r}; choose from {', '.join(SPEC_MODES)}")
    if not 1 <= k <= MAX_K:
        raise BebopError(f"K (drafts per step) must be in [1, {MAX_K}], got {k}")


def _draft(model: CausalLM, mtp_cache, ref_hidden: torch.Tensor, ref_tokens: torch.Tensor, ref_count: torch.Tensor,
           k: int, mode: str, sampling: SamplingParams, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Refresh the MTP cache with the last step's valid positions, then draft K tokens.

    ref_hidden (B, W, H), ref_tokens (B, W), ref_count (B,) -> drafts (B, K), draft_probs (B, K, V)."""
    mtp = model.require_mtp()
    batch = ref_hidden.shape[0]
    out = mtp(ref_hidden, model.embed(ref_tokens), 1, mtp_cache, ref_count)  # (B, W, H)
    hidden = out[torch.arange(batch), (ref_count - 1).clamp_min(0)]  # (B, H)
    ones = torch.ones(batch, dtype=torch.long, device=hidden.device)
    tokens, probs = [], []
    for depth in range(1, k + 1):
        if depth > 1:
            hidden = mtp(hidden[:, None], model.embed(tokens[-1])[:, None], depth, mtp_cache, ones)[:, 0]  # (B, H)
        logits = model.mtp_logits(hidden)  # (B, V)
        q = warp_probs(logits, sampling)  # (B, V)
        tokens.append(sample(q, generator) if mode == "rs" and not sampling.greedy else q.argmax(-1))
        probs.append(q)
    return torch.stack(tokens, dim=1), torch.stack(probs, dim=1)


def _accept(mode: str, drafts, draft_probs, target_probs, generator):
    if mode == "rs":
        return rejection_sample(drafts, draft_probs, target_probs, generator=generator)
    return target_only_sample(drafts, target_probs, generator=generator)


@torch.inference_mode()
def speculative_generate(model: CausalLM, prompts: Sequence[Sequence[int]], *, k: int, mode: str,
                         max_new_tokens: int, sampling: SamplingParams = SamplingParams(),
                         stop_ids: Sequence[int] = (), generator: torch.Generator | None = None, pad_id: int = 0,
                         observer: Observer | None = None, interrupt_ids: Sequence[int] = (),
                         max_observation_tokens: int = 64) -> tuple[list[Generation], SpecMetrics]:
    check_spec(mode, k)
    mtp = model.require_mtp()
    cfg = model.config
    check_prompts(prompts, cfg.max_position_embeddings, cfg.vocab_size)
    batch, device = len(prompts), model.device
    room = min(max_new_tokens, cfg.max_position_embeddings - max(len(p) for p in prompts))
    book = RowBook(prompts, room, stop_ids, interrupt_ids, observer)
    capacity = cache_capacity(prompts, max_new_tokens, cfg.max_position_embeddings, slack=max(k + 1, max_observation_tokens + 1))
    cache = model.new_cache(batch, capacity)
    mtp_cache = mtp.new_cache(batch, capacity + k, dtype=model.dtype, device=device)
    metrics = SpecMetrics(k)
    trunk_len, mtp_len = [0] * batch, [0] * batch  # host copies of the caches' lengths
    ref_hidden, ref_next, ref_count = None, [[] for _ in range(batch)], [0] * batch
    rows = torch.arange(batch, device=device)
    offsets = torch.arange(k + 1, device=device)
    while not book.all_done:
        fed = [list(p) for p in book.pending]
        drafting = [len(f) == 1 and ref_count[b] > 0 for b, f in enumerate(fed)]
        if any(ref_count):
            ref_tokens, counts = pad_chunk(ref_next, pad_id, device)  # (B, W), (B,)
            drafts, draft_probs = _draft(model, mtp_cache, ref_hidden[:, : ref_tokens.shape[1]], ref_tokens, counts,
                                         k, mode, sampling, generator)  # (B, K), (B, K, V)
            mtp_len = [n + c for n, c in zip(mtp_len, ref_count)]
            mtp_cache.rollback(torch.tensor(mtp_len, device=device), span=max(mtp_len))
        # verify: drafting rows feed [x_last, y_1..y_K]; others feed their pending tokens (a prefill)
        is_draft = torch.tensor(drafting, device=device)  # (B,)
        ids, counts = pad_chunk([f + [pad_id] * k if d else f for f, d in zip(fed, drafting)], pad_id, device)
        if any(drafting):
            ids[:, 1:k + 1] = torch.where(is_draft[:, None], drafts, ids[:, 1:k + 1])
        hidden = model(ids, cache, counts)  # (B, Wc, H)
        last = (counts - 1).clamp_min(0)  # (B,)
        positions = torch.where(is_draft[:, None], offsets, last[:, None])  # (B, K+1)
        logits = model.logits(hidden[rows[:, None], positions])  # (B, K+1, V)
        target_probs = warp_probs(logits, sampling)  # (B, K+1, V)
        plain = sample(target_probs[:, 0], generator, greedy=sampling.greedy)  # (B,)
        if any(drafting):
            tokens, accepted = _accept(mode, drafts, draft_probs, target_probs, generator)  # (B, K+1), (B,)
            tokens = torch.where(is_draft[:, None], tokens, torch.cat([plain[:, None], torch.full_like(tokens[:, 1:], -1)], 1))
            accepted = torch.where(is_draft, accepted, 0)
        else:
            tokens = torch.cat([plain[:, None], plain.new_full((batch, k), -1)], dim=1)  # (B, K+1)
            accepted = torch.zeros(batch, dtype=torch.long, device=device)
        safe = tokens.clamp_min(0)
        logprobs = torch.log(target_probs.gather(-1, safe[..., None])[..., 0])  # (B, K+1)
        ents = entropy(target_probs)  # (B, K+1)
        checked = (logits, draft_probs) if any(ref_count) else (logits,)
        host = to_host([tokens, logprobs, ents, accepted], *checked)  # the step's one host sync
        ref_hidden = hidden
        for b in range(batch):
            if not fed[b]:
                ref_count[b], ref_next[b] = 0, []
                continue
            n_acc = int(host[b][-1])
            toks = [int(t) for t in host[b][: n_acc + 1]]
            ents_b = host[b][2 * (k + 1): 2 * (k + 1) + n_acc + 1]
            kept = book.emit(b, toks, host[b][k + 1: k + 2 + n_acc], ents_b)
            if drafting[b]:
                metrics.record_draft(n_acc)
            metrics.record_emitted(ents_b[:kept])
            valid = fed[b] + toks[: kept - 1]  # tokens of this chunk now in the trunk cache
            trunk_len[b] += len(valid)
            if book.rows[b].done:
                ref_count[b], ref_next[b] = 0, []
            else:
                ref_count[b], ref_next[b] = len(valid), valid[1:] + [toks[kept - 1]]
        cache.rollback(torch.tensor(trunk_len, device=device), span=max(trunk_len))
    return book.rows, metrics
