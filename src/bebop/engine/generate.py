"""Batched autoregressive generation for ragged prompts (the baseline, no drafts).

    gens = generate(model, prompts, max_new_tokens=64, sampling=SamplingParams(1.0),
                    stop_ids=[eos], generator=torch.Generator().manual_seed(0))

The prompts are prefilled first, each distinct prompt once (engine/prefill.py: a GRPO group shares
one prefill), all but their last token. Each step then feeds every unfinished row its pending tokens
(the prompt's last token at first, then the last sampled token, or an environment observation) in
ONE forward call: rows are ragged and the
cache appends at each row's own offset. The batch is live: rows that finish leave the cache and
every later forward (`KVCache.keep`) once they are 1/COMPACT_EVERY of the batch, so a step costs
about the rows still generating without copying the cache for every finished row. Only the last
position of each row goes through the LM head. One host sync per step (the sampled tokens), which also decides which rows stopped.

Seeds: with a given generator state, prompts, batch composition and settings, the output is
reproducible. A row's samples do depend on which rows share its batch (one generator draws for
the whole batch); at temperature 0 they do not.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from bebop.engine.compiled import EagerSteps, prepared_steps
from bebop.engine.prefill import prefill
from bebop.engine.records import Generation
from bebop.engine.rows import Observer, RowBook
from bebop.errors import BebopError
from bebop.model.host_tensor import pad_chunk
from bebop.model.packed_linear import decoding
from bebop.model.qwen3 import CausalLM
from bebop.sampling import SamplingParams, entropy, sample, to_host, token_logprob, warp_probs


def check_prompts(prompts: Sequence[Sequence[int]], context: int, vocab_size: int) -> None:
    if not prompts:
        raise BebopError("no prompts given")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise BebopError(f"prompt {i} is empty")
        if len(p) >= context:
            raise BebopError(f"prompt {i} has {len(p)} tokens; the model's context is {context}")
        if max(p) >= vocab_size or min(p) < 0:
            raise BebopError(f"prompt {i} has token ids outside the model's vocabulary [0, {vocab_size})")


def cache_capacity(prompts: Sequence[Sequence[int]], max_new_tokens: int, context: int, slack: int) -> int:
    return min(max(len(p) for p in prompts) + max_new_tokens, context) + slack


COMPACT_EVERY = 8  # finished rows leave once they are 1/8 of the batch: each compaction copies the caches


def live_rows(book: RowBook, live: list[int]) -> list[int]:
    """Positions (in the current live batch) of the rows that are still generating."""
    return [i for i, row in enumerate(live) if not book.rows[row].done]


def rows_to_keep(book: RowBook, live: list[int]) -> list[int] | None:
    """The live batch's new order (positions in the current batch) when enough rows finished to pay for copying
    the caches, else None: the rows still generating, each finished row's place taken by one from the batch's
    end (`fill_from_end`), so a compaction copies as many rows as left, not every row after the first that did.

    Until then a finished row rides along feeding one padding token that nothing keeps (its
    pending input is empty), so compactions happen about COMPACT_EVERY times per halving of the
    batch instead of once per finished row (a profile at 64 rows had the copies at 20% of a run)."""
    keep = live_rows(book, live)
    dead = len(live) - len(keep)
    return fill_from_end(keep) if dead and (not keep or dead * COMPACT_EVERY >= len(live)) else None


def fill_from_end(keep: list[int]) -> list[int]:
    """The kept positions `keep` (ascending) as a new order of n = len(keep) rows: a kept row below n stays where it
    is, and each place below n that is not kept takes the next kept row at or past n. [0, 2, 3, 5] -> [0, 5, 2, 3]."""
    n = len(keep)
    kept = set(keep)
    movers = iter(r for r in keep if r >= n)  # as many as the places below n that are not kept
    return [i if i in kept else next(movers) for i in range(n)]


@torch.inference_mode()
@decoding()
def generate(model: CausalLM, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
             sampling: SamplingParams = SamplingParams(), stop_ids: Sequence[int] = (),
             generator: torch.Generator | None = None, pad_id: int = 0,
             observer: Observer | None = None, interrupt_ids: Sequence[int] = (),
             max_observation_tokens: int = 64) -> list[Generation]:
    cfg = model.config
    check_prompts(prompts, cfg.max_position_embeddings, cfg.vocab_size)
    book = RowBook(prompts, max_new_tokens, stop_ids, interrupt_ids, observer, context=cfg.max_position_embeddings)
    cache = model.new_cache(len(prompts), cache_capacity(prompts, max_new_tokens, cfg.max_position_embeddings,
                                                       slack=max_observation_tokens + 1))
    live, lengths = _leave_finished(book, list(range(len(prompts))), [0] * len(prompts), cache)
    # live: prompt index of each cache row; lengths: host copy of cache.lengths, exact
    steps = prepared_steps(model)  # the step's forward: compiled when compile_steps compiled the model
    lengths = prefill_prompts(model, book, live, cache, pad_id=pad_id, steps=steps)
    while live:
        pending = [book.pending[row] for row in live]
        ids, counts = pad_chunk(pending, pad_id, model.device)  # (R, T), (R,)
        hidden = steps.forward(model, ids, cache, counts)  # (R, T, H)
        last = (counts - 1).clamp_min(0)  # (R,)
        logits = model.logits(hidden[torch.arange(len(live)), last])  # (R, V)
        probs = warp_probs(logits, sampling)  # (R, V)
        tokens = sample(probs, generator, greedy=sampling.greedy)  # (R,)
        host = to_host([tokens, token_logprob(probs, tokens), entropy(probs)], logits)  # the step's one host sync
        for i, row in enumerate(live):
            lengths[i] += len(pending[i])
            tok, lp, ent = host[i]
            book.emit(row, [int(tok)], [lp], [ent])
        cache.span = max(lengths)
        live, lengths = _leave_finished(book, live, lengths, cache)
    return book.rows


def prefill_prompts(model: CausalLM, book: RowBook, live: list[int], cache, *, steps: EagerSteps, mtp_cache=None,
                    pad_id: int = 0) -> list[int]:
    """Prefill the live rows' prompts but their last tokens (engine/prefill.py, through the engine call's step
    functions `steps`), which stay pending for the first step; -> each cache row's length."""
    if not live:
        return []
    lengths = prefill(model, [book.pending[row] for row in live], cache, mtp_cache=mtp_cache, pad_id=pad_id,
                      steps=steps)
    for row, n in zip(live, lengths):
        book.pending[row] = book.pending[row][n:]
    return lengths


def _leave_finished(book: RowBook, live: list[int], lengths: list[int], cache) -> tuple[list[int], list[int]]:
    """Drop the rows that finished from the live batch and its cache, once enough did."""
    order = rows_to_keep(book, live)
    if order is None:
        return live, lengths
    lengths = [lengths[i] for i in order]
    if order:
        cache.compact(order, span=max(lengths))
    return [live[i] for i in order], lengths
