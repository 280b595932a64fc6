"""The live batch: finished rows leave every forward (plain and speculative), adaptive K of any
schedule (0 included, so the MTP head catches up over skipped spans) keeps T=0 output equal to
greedy and sampled output distributed as the target's, including when rows finish at different steps."""

import itertools

import pytest
import torch

from bebop.engine import generate
from bebop.engine import speculative as spec
from bebop.engine.generate import COMPACT_EVERY
from bebop.engine.refresh_log import RefreshLog
from bebop.sampling import SamplingParams, warp_probs

from conftest import CHAR_CODEC
from spec_helpers import PROMPTS, ids_of, mixture_drafter, oracle_drafter
from stats_helpers import assert_follows

EOS_ = CHAR_CODEC.eos_id


class Schedule:
    """A stand-in for AdaptiveK that verifies a fixed cycle of k (0 = a plain step)."""

    def __init__(self, ks):
        self.ks = itertools.cycle(ks)
        self.observed = []

    def choose(self, rows):
        return next(self.ks)

    def observe(self, rows, k, seconds, accepted):
        self.observed.append((rows, k, len(accepted)))


def _batch_sizes(model):
    """The rows of every trunk forward of the decoding loop; the prefill's (engine/prefill.py: on scratch caches
    exactly as wide as their chunk) are not counted."""
    sizes = []

    def record(mod, args):
        ids, cache = args[0], args[1] if len(args) > 1 else None
        if cache is not None and cache.capacity > ids.shape[1]:  # not a drafter's full forward, nor a prefill
            sizes.append(ids.shape[0])

    return sizes, model.register_forward_pre_hook(record)


def test_plain_rows_leave_the_forward_when_they_stop(spec_model):
    prompts = ids_of(PROMPTS)
    free = generate(spec_model, prompts, max_new_tokens=30, sampling=SamplingParams(0.0))
    stop = free[2].token_ids[4]  # row 2 stops early; others may too
    ref = [generate(spec_model, [p], max_new_tokens=30, sampling=SamplingParams(0.0), stop_ids=[stop])[0]
           for p in prompts]
    sizes, handle = _batch_sizes(spec_model)
    try:
        gens = generate(spec_model, prompts, max_new_tokens=30, sampling=SamplingParams(0.0), stop_ids=[stop])
    finally:
        handle.remove()
    assert [g.token_ids for g in gens] == [r.token_ids for r in ref]
    steps_alive = [sum(len(g.token_ids) > s for g in gens) for s in range(len(sizes))]
    assert sizes == steps_alive  # each forward carried exactly the rows still generating
    assert sizes[-1] < len(prompts)


@pytest.mark.parametrize("mode", ["rs", "to"])
@pytest.mark.parametrize("schedule", [(0, 3, 0, 0, 2), (4, 0, 1), (0, 0, 0, 0, 0, 0, 0, 5)])
def test_adaptive_schedules_keep_greedy_output(spec_model, monkeypatch, mode, schedule):
    """Any schedule of k, with plain steps in between (the MTP head then catches up over the
    skipped span in one refresh), and rows finishing at different steps: output is plain greedy."""
    prompts = ids_of(PROMPTS)
    free = generate(spec_model, prompts, max_new_tokens=33, sampling=SamplingParams(0.0))
    stop = free[1].token_ids[15]
    ref = generate(spec_model, prompts, max_new_tokens=33, sampling=SamplingParams(0.0), stop_ids=[EOS_, stop])
    monkeypatch.setattr(spec, "_draft", oracle_drafter(spec_model, prompts, corrupt=0.4, seed=2))
    sizes, handle = _batch_sizes(spec_model)
    try:
        gens, metrics = spec.speculative_generate(spec_model, prompts, k="auto", max_k=5, mode=mode,
                                                  max_new_tokens=33, sampling=SamplingParams(0.0),
                                                  stop_ids=[EOS_, stop], controller=Schedule(schedule))
    finally:
        handle.remove()
    for a, b in zip(gens, ref):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
    assert metrics.mean_acceptance_length > 1.5
    assert set(metrics.k_histogram["4-7"]) <= set(schedule)  # every decision was counted by live size
    assert min(sizes) < len(prompts)  # finished rows left the trunk forward


def test_sampled_output_is_lossless_with_plain_steps_and_early_stops(spec_model, monkeypatch):
    """RS through the engine with k cycling 0, 2, 1 (catch-up refreshes) and a stop token that ends
    many rows after their first token (so rows leave the batch at different steps): x1 ~ p(.|prompt)
    and, for the most frequent non-stop x1, x2 ~ p(.|prompt, x1). Chi-square at alpha = 1e-6."""
    params = SamplingParams(1.5, top_k=8)
    prompt = CHAR_CODEC.encode("hello")
    with torch.no_grad():
        p1 = warp_probs(spec_model.logits(spec_model(torch.tensor([prompt])))[0, -1], params)  # (V,)
    ranked = p1.argsort(descending=True)
    stop, top = int(ranked[1]), int(ranked[0])  # the second most likely first token stops its row
    n = 3000
    monkeypatch.setattr(spec, "_draft", mixture_drafter(spec_model, [prompt] * n, params))
    gens, metrics = spec.speculative_generate(spec_model, [prompt] * n, k="auto", max_k=2, mode="rs",
                                              max_new_tokens=4, sampling=params, stop_ids=[stop],
                                              generator=torch.Generator().manual_seed(0),
                                              controller=Schedule((0, 2, 1)))
    assert 0.5 < metrics.acceptance_rate < 0.98
    first = torch.tensor([g.token_ids[0] for g in gens])
    assert_follows(first, p1)
    assert any(len(g.token_ids) == 1 for g in gens) and any(len(g.token_ids) == 4 for g in gens)
    second = torch.tensor([g.token_ids[1] for g in gens if g.token_ids[0] == top])
    with torch.no_grad():
        p2 = warp_probs(spec_model.logits(spec_model(torch.tensor([prompt + [top]])))[0, -1], params)
    assert_follows(second, p2)


def test_refresh_log_concatenates_valid_prefixes_in_order():
    log = RefreshLog(3)
    a = torch.arange(3 * 4 * 2, dtype=torch.float32).reshape(3, 4, 2)  # (R, T, H)
    b = 100 + torch.arange(3 * 2 * 2, dtype=torch.float32).reshape(3, 2, 2)
    log.add(a, [2, 4, 1], [[1, 2], [3, 4, 5, 6], [7]])
    log.add(b, [1, 0, 2], [[8], [], [9, 10]])
    assert log.positions == 4 + 2
    log.keep([1])  # a view of the rows that keeps only row 1: chunk b has no position of it left
    assert log.positions == 4
    log = RefreshLog(3)
    log.add(a, [2, 4, 1], [[1, 2], [3, 4, 5, 6], [7]])
    log.add(b, [1, 0, 2], [[8], [], [9, 10]])
    log.keep([2, 0])  # row 1 finished; the rest reorder
    assert log.positions == 4 + 2
    hidden, tokens, counts = log.take(pad_id=0)
    assert counts.tolist() == [3, 3]
    assert tokens.tolist() == [[7, 9, 10], [1, 2, 8]]
    assert torch.equal(hidden[0], torch.stack([a[2, 0], b[2, 0], b[2, 1]]))
    assert torch.equal(hidden[1], torch.stack([a[0, 0], a[0, 1], b[0, 0]]))
    assert log.counts == [0, 0] and log.positions == 0


def test_catch_up_refresh_equals_refreshing_every_step(spec_model, monkeypatch):
    """After plain steps, the first draft of each row comes from an MTP cache refreshed over the
    whole skipped span in one forward: its q_1 equals the head run over the full sequence."""
    prompts = ids_of(PROMPTS[:4])
    seen = []
    real = spec._draft

    def spy(steps, model, mtp_cache, ref_hidden, ref_tokens, ref_count, k, mode, sampling, draws, rows):
        drafts, probs = real(steps, model, mtp_cache, ref_hidden, ref_tokens, ref_count, k, mode, sampling, draws, rows)
        seen.append((list(rows), ref_count.tolist(), probs[:, 0].clone()))
        return drafts, probs

    monkeypatch.setattr(spec, "_draft", spy)
    params = SamplingParams(1.0)
    gens, _ = spec.speculative_generate(spec_model, prompts, k="auto", max_k=2, mode="rs", max_new_tokens=9,
                                        sampling=params, generator=torch.Generator().manual_seed(0),
                                        controller=Schedule((0, 0, 0, 0, 2)))
    rows, counts, q1 = seen[0]
    # the prefill refreshed the prompt but its last token; the first step (that token) and four plain steps
    # emitted 5 tokens, the trunk consumed all but the last: 5 positions wait, and the head's cache built at
    # prefill plus this catch-up equals the head run over the whole sequence (below)
    assert counts == [5 for _ in rows]
    mtp = spec_model.require_mtp()
    for i, row in enumerate(rows):
        seq = prompts[row] + gens[row].token_ids[:5]  # positions refreshed, and the token after the last
        with torch.no_grad():
            hidden = spec_model(torch.tensor([seq[:-1]]))  # (1, T-1, H)
            cache = mtp.new_cache(1, len(seq), dtype=spec_model.dtype, device=spec_model.device)
            out = mtp(hidden, spec_model.embed(torch.tensor([seq[1:]])), 1, cache, torch.tensor([len(seq) - 1]))
            ref = warp_probs(spec_model.mtp_logits(out[0, -1]), params)
        assert torch.allclose(q1[i], ref, atol=1e-5)


@pytest.mark.parametrize("mode", ["rs", "to"])
def test_finished_rows_ride_along_until_enough_of_them_finished(spec_model, monkeypatch, mode):
    """In a larger batch a finished row stays in the forward (feeding padding nothing keeps) until
    1/COMPACT_EVERY of the batch has finished: output is unchanged (T=0 == one row at a time)."""
    prompts = ids_of([f"{p}{i}" for i in range(4) for p in PROMPTS])  # 24 rows: compaction waits for 3
    free = generate(spec_model, prompts[:6], max_new_tokens=30, sampling=SamplingParams(0.0))
    stops = [EOS_, free[2].token_ids[4], free[1].token_ids[11]]
    ref = [generate(spec_model, [p], max_new_tokens=30, sampling=SamplingParams(0.0), stop_ids=stops)[0] for p in prompts]
    sizes, handle = _batch_sizes(spec_model)
    try:
        plain = generate(spec_model, prompts, max_new_tokens=30, sampling=SamplingParams(0.0), stop_ids=stops)
    finally:
        handle.remove()
    alive = [sum(len(g.token_ids) > s for g in plain) for s in range(len(sizes))]
    assert any(n > a for n, a in zip(sizes, alive))  # finished rows rode along for a while
    assert all(n == a or (n - a) * COMPACT_EVERY < n for n, a in zip(sizes, alive))
    monkeypatch.setattr(spec, "_draft", oracle_drafter(spec_model, prompts, corrupt=0.4, seed=3))
    gens, _ = spec.speculative_generate(spec_model, prompts, k="auto", max_k=3, mode=mode, max_new_tokens=30,
                                        sampling=SamplingParams(0.0), stop_ids=stops, controller=Schedule((2, 0, 3)))
    for a, b, c in zip(plain, gens, ref):
        assert a.token_ids == b.token_ids == c.token_ids and a.finish_reason == b.finish_reason == c.finish_reason
