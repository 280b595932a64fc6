"""vLLM behind bebop's engine interface: `VllmEngine(worker)` is a `generate_fn` (the signature of
bebop.engine.generate), so episodes, rewards, rollout dumps and the RL loop run on it unchanged.

    engine = VllmEngine(VllmWorker(model_dir, dtype="float32"))
    gens = engine(model, prompts, max_new_tokens=64, sampling=SamplingParams(1.0), stop_ids=[eos],
                  generator=g, observer=observe, interrupt_ids=[call_end])      # list[Generation]

The stop rules are bebop's own (bebop.engine.rows.RowBook applied to what vLLM returns): vLLM stops at
the stop and interrupt ids, the book truncates, hands an interrupted row to the environment, and the row
goes back to vLLM with its transcript as the prompt (prefix caching makes that a short prefill). Each row
is sampled with its own seed drawn from `generator`, so a batch is a function of the generator's seed.
What vLLM does not report is left unknown, never made up: the sampler's entropy per token is NaN and a
row's target forwards 0 (its acceptance length unknown); the engine-wide acceptance counters come from
vLLM's own spec_decode_* counters (`spec_metrics`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from bebop.engine.generate import check_prompts
from bebop.engine.metrics import SpecMetrics
from bebop.engine.records import Generation
from bebop.engine.rows import Observer, RowBook
from bebop.sampling import SamplingParams
from bebop.vllm.client import VllmWorker

SEED_RANGE = 2**31 - 1


def vllm_params(sampling: SamplingParams, max_tokens: int, stop_ids: Sequence[int], seed: int) -> dict:
    return {"temperature": 0.0 if sampling.greedy else sampling.temperature, "top_k": sampling.top_k,
            "top_p": sampling.top_p, "max_tokens": max_tokens, "stop_token_ids": sorted(stop_ids), "seed": seed}


class VllmEngine:
    def __init__(self, worker: VllmWorker) -> None:
        self.worker = worker

    def __call__(self, model, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                 sampling: SamplingParams = SamplingParams(), stop_ids: Sequence[int] = (),
                 generator: torch.Generator | None = None, pad_id: int = 0, observer: Observer | None = None,
                 interrupt_ids: Sequence[int] = (), **_: object) -> list[Generation]:
        """`model` (bebop's copy of the weights vLLM serves) gives the context and vocabulary checks only."""
        context, vocab = model.config.max_position_embeddings, model.config.vocab_size
        check_prompts(prompts, context, vocab)
        book = RowBook(prompts, max_new_tokens, stop_ids, interrupt_ids, observer, context=context)
        seeds = torch.randint(SEED_RANGE, (len(prompts),), generator=generator).tolist()  # (N,) one per row
        halt = sorted(set(stop_ids) | set(book.interrupt_ids))
        live, turn = [b for b, row in enumerate(book.rows) if not row.done], 0
        while live:  # one turn per environment answer (a single turn without interrupts)
            rows = [book.rows[b] for b in live]
            params = [vllm_params(sampling, book.room_left(b), halt, (seeds[b] + turn) % SEED_RANGE) for b in live]
            outputs = self.worker.generate([r.prompt_ids + r.token_ids for r in rows], params)
            for b, out in zip(live, outputs):
                tokens = out["token_ids"]
                logprobs = [0.0] * len(tokens) if sampling.greedy else out["logprobs"]  # greedy: a point mass
                book.emit(b, tokens, logprobs, [math.nan] * len(tokens))
            live, turn = [b for b in live if not book.rows[b].done], turn + 1
        for row in book.rows:
            row.forwards = 0  # unknown: vLLM reports acceptance per engine, not per row
        return book.rows

    def spec_metrics(self, before: dict, k: int) -> SpecMetrics | None:
        """vLLM's counters since `before` (a `worker.counters()` snapshot) as bebop's SpecMetrics, or None
        when vLLM did not draft."""
        grown = self.worker.counters_since(before)
        if not grown.get("spec_decode_num_drafts"):
            return None
        return SpecMetrics(k, num_drafts=int(grown["spec_decode_num_drafts"]),
                           num_draft_tokens=int(grown["spec_decode_num_draft_tokens"]),
                           num_accepted_tokens=int(grown["spec_decode_num_accepted_tokens"]),
                           accepted_per_position=[int(a) for a in grown["spec_decode_num_accepted_tokens_per_pos"]])

    @contextmanager
    def counting(self, k: int, sink: list[SpecMetrics]) -> Iterator[None]:
        """vLLM's drafting over the block, appended to `sink` as SpecMetrics (nothing when it did not draft)."""
        before = self.worker.counters()
        yield
        drafted = self.spec_metrics(before, k)
        sink += [drafted] if drafted is not None else []
