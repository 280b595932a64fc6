"""Cached decoding against full recomputation: ragged rows, chunks, rollback."""

import pytest
import torch

from bebop.model import load_model
from bebop.model.host_tensor import host_tensor


def _full_logits(model, seq):
    with torch.no_grad():
        return model.logits(model(torch.tensor([seq])))[0]  # (T, V)


def test_ragged_chunks_equal_full_recompute(hf_model_dir):
    _, path = hf_model_dir
    model = load_model(path)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 100, (n,), generator=g).tolist() for n in (30, 17, 25)]
    cache = model.new_cache(3, 64)
    fed = [0, 0, 0]
    # feed each row in ragged chunks of different sizes per call (prefill, decode, verify-like)
    plan = [[5, 9, 1], [1, 0, 7], [4, 1, 1], [20, 7, 16]]
    with torch.no_grad():
        for counts in plan:
            width = max(counts)
            ids = torch.zeros(3, width, dtype=torch.long)
            for b, c in enumerate(counts):
                ids[b, :c] = torch.tensor(seqs[b][fed[b]:fed[b] + c], dtype=torch.long)
            hidden = model(ids, cache, torch.tensor(counts))
            for b, c in enumerate(counts):
                ref = _full_logits(model, seqs[b][: fed[b] + c])[fed[b]:]
                assert torch.allclose(model.logits(hidden[b, :c]), ref, atol=1e-4)
                fed[b] += c
            cache.span = max(fed)
    assert cache.lengths.tolist() == fed


@pytest.mark.parametrize("host_list", [False, True])  # the lengths as a tensor, or as the engine's host list
def test_rollback_then_continue_equals_recompute(hf_model_dir, host_list):
    _, path = hf_model_dir
    model = load_model(path)
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(0, 100, (2, 10), generator=g)
    junk = torch.randint(0, 100, (2, 4), generator=g)
    good = torch.randint(0, 100, (2, 4), generator=g)
    cache = model.new_cache(2, 32)
    with torch.no_grad():
        model(prefix, cache)
        model(junk, cache)  # e.g. rejected drafts
        keep = torch.tensor([1, 3])  # rows keep different numbers of the junk tokens
        lengths = torch.tensor([10, 10]) + keep
        cache.rollback(lengths.tolist() if host_list else lengths, span=int(lengths.max()))
        hidden = model(good, cache)
        for b in range(2):
            seq = prefix[b].tolist() + junk[b, : keep[b]].tolist() + good[b].tolist()
            ref = _full_logits(model, seq)[-4:]
            assert torch.allclose(model.logits(hidden[b]), ref, atol=1e-4)


def test_keep_gathers_the_used_span_and_zeroes_the_rest():
    """Compaction reads only positions < span (issue 24): those equal a full gather, the rest are zeros
    (finite: attention reads them masked)."""
    from bebop.model.kv_cache import KVCache

    cache = KVCache(3, 6, 2, 4, 20, dtype=torch.float32, device="cpu")
    gen = torch.Generator().manual_seed(0)
    for t in cache.k + cache.v:  # (B, Hkv, S, Dh) per layer
        t.normal_(generator=gen)
    full_k, full_v = [t.clone() for t in cache.k], [t.clone() for t in cache.v]
    cache.lengths.copy_(torch.tensor([3, 7, 1, 9, 2, 5]))
    rows = torch.tensor([3, 0, 5])
    cache.keep(rows, span=9)
    for kept, full in zip(cache.k + cache.v, full_k + full_v):
        assert kept.shape == (3, 2, 20, 4) and kept.is_contiguous()
        assert torch.equal(kept[:, :, :9], full.index_select(0, rows)[:, :, :9])
        assert not kept[:, :, 9:].any()
    assert cache.lengths.tolist() == [9, 3, 5] and cache.span == 9


@pytest.mark.parametrize("foreach_rows", [0, 2])  # the moved rows copied by index ops, or in one foreach call
def test_compact_moves_only_the_rows_that_fill_the_places_of_those_that_left(foreach_rows, monkeypatch):
    """A live batch's finished rows leave: kept rows from the batch's end move into their places over the used
    positions (< span), within the same buffers (no new storage, nothing zeroed), equal to a gather of the rows in
    their new order; rows that stay are not copied; an order that moves a row below the kept count is refused."""
    from bebop.engine.generate import fill_from_end
    from bebop.model import kv_cache
    from bebop.model.kv_cache import KVCache

    monkeypatch.setattr(kv_cache, "FOREACH_ROWS", foreach_rows)

    cache = KVCache(3, 6, 2, 4, 20, dtype=torch.float32, device="cpu")
    gen = torch.Generator().manual_seed(0)
    for t in cache.k + cache.v:  # (B, Hkv, S, Dh) per layer
        t.normal_(generator=gen)
    full = [t.clone() for t in cache.k + cache.v]
    storage = [t.untyped_storage().data_ptr() for t in cache.k + cache.v]
    cache.lengths.copy_(torch.tensor([3, 7, 1, 9, 2, 5]))
    order = fill_from_end([0, 1, 3, 5])  # rows 2 and 4 finished
    assert order == [0, 1, 5, 3]  # row 5 takes row 2's place; row 3 stays
    cache.compact(order, span=9)
    for kept, before, ptr in zip(cache.k + cache.v, full, storage):
        assert kept.shape == (4, 2, 20, 4) and kept.untyped_storage().data_ptr() == ptr
        assert torch.equal(kept[:, :, :9], before[order][:, :, :9])
        assert torch.equal(kept[:, :, 9:], before[:4, :, 9:])  # past the span: untouched, not zeroed
    assert cache.lengths.tolist() == [3, 7, 5, 9] and cache.span == 9 and cache.batch_size == 4
    cache.compact([0, 1, 2], span=7)  # the last row leaves: nothing moves
    assert cache.lengths.tolist() == [3, 7, 5] and cache.batch_size == 3 and cache.k[0].shape[0] == 3
    assert fill_from_end([1, 2, 3]) == [3, 1, 2] and fill_from_end([]) == [] and fill_from_end([0, 1]) == [0, 1]
    for bad in ([1, 0], [2, 2], [0, 6]):
        with pytest.raises(AssertionError):
            cache.compact(bad, span=9)


def test_host_tensor_keeps_the_shape_values_and_dtype_of_its_list():
    ids = host_tensor([[5, 0, 7], [1, 2, 3]], torch.device("cpu"))
    assert ids.dtype == torch.long and ids.tolist() == [[5, 0, 7], [1, 2, 3]]
    mask = host_tensor([True, False], torch.device("cpu"), torch.bool)
    assert mask.dtype == torch.bool and mask.tolist() == [True, False]
