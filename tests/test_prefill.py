"""The group's prompt prefilled once (engine/prefill.py): each distinct prompt is one prefill row, its cache
rows (KV, a hybrid's conv and recurrent states, the head's cache) are copied into every row that shares it,
and the next step's logits equal those of each row prefilled on its own (float32, to rounding)."""

import copy

import pytest
import torch

from bebop.engine import compiled
from bebop.engine.prefill import MAX_BUCKET_TOKENS, PAD_SHARE, buckets, prefill
from qwen35_helpers import headed_hybrid

from spec_helpers import PROMPTS, ids_of

GROUP = 4


def _grpo_batch():
    """Four distinct prompts of 1 to 23 tokens, each GROUP times, interleaved (rows of a group not adjacent)."""
    distinct = ids_of([PROMPTS[0], PROMPTS[2], PROMPTS[3], PROMPTS[5]])
    return [distinct[i % len(distinct)] for i in range(GROUP * len(distinct))], distinct


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    return headed_hybrid(tmp_path_factory.mktemp("qwen35_prefill"))


def _prefill_rows(model, prompts, steps=compiled.EAGER):
    """Prefill into fresh caches through the step functions `steps`, counting the rows of every trunk forward the
    model's own call runs; then feed each row its last prompt token and return (that step's logits (B, V), rows per
    prefill forward, the head's cache)."""
    cache = model.new_cache(len(prompts), 64)
    head = model.require_mtp().new_cache(len(prompts), 64, dtype=model.dtype, device=model.device)
    rows = []
    handle = model.register_forward_pre_hook(lambda mod, args: rows.append(args[0].shape[0]))
    try:
        with torch.no_grad():
            lengths = prefill(model, prompts, cache, mtp_cache=head, steps=steps)
    finally:
        handle.remove()
    assert lengths == [len(p) - 1 for p in prompts]
    assert cache.lengths.tolist() == lengths and head.lengths.tolist() == lengths
    last = torch.tensor([[p[-1]] for p in prompts])  # (B, 1)
    with torch.no_grad():
        logits = model.logits(model(last, cache))[:, 0]  # (B, V)
    return logits, rows, head


def _batch(shape):
    """grpo: _grpo_batch (a prompt of one token: not every row is prefilled); distinct: every row its own prompt,
    of several lengths (each row's states gathered from the prefill's); level: distinct prompts of one length in
    the rows' order (the cache takes the prefill's states as they are)."""
    if shape == "grpo":
        return _grpo_batch()
    if shape == "distinct":
        distinct = ids_of([PROMPTS[5], PROMPTS[0], PROMPTS[1]])  # 10, 13, 11 tokens: one prefill forward
    else:
        distinct = [p[:9] for p in ids_of([PROMPTS[5], PROMPTS[0], PROMPTS[3], PROMPTS[1]])]
        assert len({len(p) for p in distinct}) == 1 and len({tuple(p) for p in distinct}) == 4
    return distinct, distinct


@pytest.mark.parametrize("kind, shape", [("dense", "grpo"), ("hybrid", "grpo"), ("hybrid", "distinct"),
                                         ("hybrid", "level")])
def test_group_prefill_equals_each_row_prefilled_alone(spec_model, hybrid, kind, shape):
    model = spec_model if kind == "dense" else hybrid
    prompts, distinct = _batch(shape)
    logits, rows, _ = _prefill_rows(model, prompts)
    assert sum(rows) == len([p for p in distinct if len(p) > 1])  # one prefill row per distinct prompt
    for b, prompt in enumerate(prompts):
        alone, _, _ = _prefill_rows(model, [prompt])
        with torch.no_grad():
            full = model.logits(model(torch.tensor([prompt])))[0, -1]  # no cache at all
        assert torch.allclose(logits[b], alone[0], atol=1e-4), (kind, b)  # a batch's matmuls round as they will
        assert torch.allclose(logits[b], full, atol=1e-4), (kind, b)


def test_group_prefill_fills_the_heads_cache_as_each_row_alone(spec_model):
    prompts, _ = _grpo_batch()
    _, _, head = _prefill_rows(spec_model, prompts)
    for b, prompt in enumerate(prompts):
        _, _, alone = _prefill_rows(spec_model, [prompt])
        n = len(prompt) - 1
        for mine, theirs in zip(head.k + head.v, alone.k + alone.v):
            assert torch.allclose(mine[b, :, :n], theirs[0, :, :n], atol=1e-5), b


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
def test_a_compiled_prefill_equals_the_eager_one(spec_model, hybrid, kind):
    """With compiled steps a dense trunk's prefill runs the graph of its chunks, one call a length bucket (a hybrid's
    stays eager: its graphs are one per chunk length), and the head's part its own graph; the next step's logits and
    the head's cache equal an eager prefill's (float32, to rounding)."""
    model = copy.deepcopy(spec_model if kind == "dense" else hybrid)
    prompts, distinct = _grpo_batch()
    ref, _, ref_head = _prefill_rows(model, prompts)
    assert compiled.compile_steps(model, "on")
    steps = compiled.prepared_steps(model)
    logits, _, head = _prefill_rows(model, prompts, steps)
    widths = sorted((len(p) - 1 for p in distinct if len(p) > 1), reverse=True)
    forwards = len(buckets(widths))
    assert forwards > 1 and min(widths) > 1  # several forwards, each wide enough for the head's graph
    assert steps.failed is None
    assert (steps.calls["trunk"], steps.calls["head"]) == (forwards if kind == "dense" else 0, forwards)
    assert torch.allclose(logits, ref, atol=1e-4)
    for mine, theirs in zip(head.k + head.v, ref_head.k + ref_head.v):
        assert torch.allclose(mine, theirs, atol=1e-4)


def test_buckets_bound_padding_and_size():
    lengths = [100, 98, 90, 60, 59, 10, 9, 9, 1]  # longest first, as prefill sorts them
    out = buckets(lengths)
    assert sorted(i for b in out for i in b) == list(range(len(lengths)))
    for bucket in out:
        width = lengths[bucket[0]]
        real = sum(lengths[i] for i in bucket)
        assert len(bucket) * width - real <= PAD_SHARE * len(bucket) * width
        assert len(bucket) * width <= MAX_BUCKET_TOKENS or len(bucket) == 1
    assert out == [[0, 1, 2, 3, 4], [5, 6, 7], [8]]  # similar lengths share a forward, 100 and 10 do not
