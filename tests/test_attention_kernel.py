"""Attention over a KV cache as a CPU kernel (model/attention_kernel.cpp) against torch's
scaled_dot_product_attention, which it replaces over a KV cache: every head dim it dispatches on, grouped query
heads, strided cache views, masks that hide keys, chunks of several positions (a verify, a prefill) alike bit for bit
with one position at a time, its two scoring paths alike, any thread count, inside a compiled graph, and torch's
call wherever the kernel does not apply."""

import threading

import pytest
import torch
import torch.nn.functional as F

from bebop.model import attention_kernel
from bebop.model.attention_kernel import cached_attention
from native_helpers import built_or_skip


@pytest.fixture(scope="module")
def kernel():
    return built_or_skip(attention_kernel.cpu_kernel)


def _operands(b, hq, hkv, t, s, d, seed, spare=5):
    """q (B, Hq, T, D); k, v (B, Hkv, S, D) as the cache hands them (the first S positions of a longer buffer);
    a mask as the engine's: each row sees its first `length` keys, its chunk's positions causally."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, t, d, generator=gen)
    k = torch.randn(b, hkv, s + spare, d, generator=gen)[:, :, :s]
    v = torch.randn(b, hkv, s + spare, d, generator=gen)[:, :, :s]
    lengths = torch.randint(max(t, s - 6), s + 1, (b,), generator=gen)  # (B,)
    limit = lengths[:, None] - t + 1 + torch.arange(t)[None, :]  # (B, T): keys below it are seen
    mask = torch.arange(s)[None, None, None, :] < limit[:, None, :, None]  # (B, 1, T, S)
    return q, k, v, mask


def _reference(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


# head dims: the compile-time ones (32, 64, 128) and the run-time loop (24: no whole vectors; 256); query groups of
# 1, 2 and 8 (8: the keys scored a vector at a time)
@pytest.mark.parametrize("b, hq, hkv, s, d", [(1, 4, 2, 150, 32), (3, 4, 2, 37, 64), (2, 2, 2, 9, 128),
                                              (2, 8, 1, 20, 24), (1, 2, 1, 70, 256), (64, 4, 2, 33, 32),
                                              (2, 8, 1, 1, 32)])
def test_kernel_computes_torchs_attention(kernel, b, hq, hkv, s, d):
    q, k, v, mask = _operands(b, hq, hkv, 1, s, d, seed=s + d)
    out = cached_attention(q, k, v, mask)
    assert out.shape == (b, hq, 1, d)
    torch.testing.assert_close(out, _reference(q, k, v, mask), rtol=1e-5, atol=1e-6)


def test_kernel_takes_a_per_head_mask_and_scattered_hidden_keys(kernel):
    q, k, v, _ = _operands(3, 4, 2, 1, 40, 32, seed=1)
    mask = torch.rand(3, 4, 1, 40, generator=torch.Generator().manual_seed(2)) > 0.4  # (B, Hq, T, S)
    mask[..., 0] = True
    torch.testing.assert_close(cached_attention(q, k, v, mask), _reference(q, k, v, mask), rtol=1e-5, atol=1e-6)


def test_a_query_that_sees_no_key_gets_zeros(kernel):
    q, k, v, mask = _operands(2, 2, 1, 1, 12, 32, seed=3)
    mask[1] = False
    out = cached_attention(q, k, v, mask)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    torch.testing.assert_close(out[0], _reference(q, k, v, mask)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("d", [32, 64, 128])
def test_the_two_scoring_paths_round_alike(kernel, d):
    """A group of 8 query heads scores a vector of keys at a time, a group of 2 key by key: the same heads give
    bit for bit the same outputs either way (a batch's shape never changes a row's numbers)."""
    q, k, v, mask = _operands(2, 8, 1, 1, 45, d, seed=d)
    grouped = cached_attention(q, k, v, mask)
    for first in range(0, 8, 2):
        pair = cached_attention(q[:, first:first + 2].contiguous(), k, v, mask)
        assert torch.equal(grouped[:, first:first + 2], pair)


def test_a_row_computes_alike_in_any_batch(kernel):
    q, k, v, mask = _operands(5, 4, 2, 1, 60, 64, seed=4)
    whole = cached_attention(q, k, v, mask)
    alone = cached_attention(q[2:3], k[2:3], v[2:3], mask[2:3])
    assert torch.equal(whole[2:3], alone)


def test_kernel_runs_inside_a_compiled_graph(kernel):
    q, k, v, mask = _operands(4, 4, 2, 1, 30, 32, seed=5)

    def step(q, k, v, mask):
        return cached_attention(q * 1.0, k, v, mask) + 1.0

    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    assert torch.equal(compiled(q, k, v, mask), step(q, k, v, mask))


# a verify's k + 1 positions, a prefill's prompt (S = T), a chunk over a long cache
@pytest.mark.parametrize("b, t, s, d", [(3, 4, 40, 32), (64, 6, 50, 32), (2, 30, 30, 64), (1, 7, 200, 128),
                                        (2, 5, 19, 24)])
def test_a_chunk_computes_torchs_attention_and_each_position_alone(kernel, b, t, s, d):
    """Over a chunk of T positions the kernel computes torch's attention, and each position's output is bit for bit
    the one a decode step (that position alone, its row of the mask) gets: a verify sees the numbers decoding would."""
    q, k, v, mask = _operands(b, 4, 2, t, s, d, seed=t + s)
    chunk = cached_attention(q, k, v, mask)
    torch.testing.assert_close(chunk, _reference(q, k, v, mask), rtol=1e-5, atol=1e-6)
    for i in range(t):
        alone = cached_attention(q[:, :, i:i + 1].contiguous(), k, v, mask[:, :, i:i + 1])
        assert torch.equal(chunk[:, :, i:i + 1], alone)


def test_the_thread_count_does_not_change_a_number(kernel):
    q, k, v, mask = _operands(16, 4, 2, 5, 80, 32, seed=8)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cached_attention(q, k, v, mask)
        torch.set_num_threads(2)
        assert torch.equal(cached_attention(q, k, v, mask), one)
    finally:
        torch.set_num_threads(before)


def test_a_threads_own_count_survives_the_kernel(kernel):
    """A thread that set its torch thread count keeps it through its first kernel call, though another thread set
    another count since (the async RL loop's rollout and learner threads): the kernel's threads are torch's."""
    q, k, v, mask = _operands(64, 4, 2, 6, 60, 32, seed=9)
    own_set, others_set, seen = threading.Event(), threading.Event(), []

    def worker():
        torch.get_num_threads()  # torch's own setup of the thread's count, as the RL loop's worker does first
        torch.set_num_threads(1)
        own_set.set()
        others_set.wait()
        cached_attention(q, k, v, mask)
        seen.append(torch.get_num_threads())

    before = torch.get_num_threads()
    thread = threading.Thread(target=worker)
    try:
        thread.start()
        own_set.wait()
        torch.set_num_threads(2)
        others_set.set()
        thread.join()
    finally:
        torch.set_num_threads(before)
    assert seen == [1]


@pytest.mark.parametrize("case", ["unmasked", "bfloat16", "grad"])
def test_torchs_attention_serves_where_the_kernel_does_not_apply(case):
    q, k, v, mask = _operands(2, 4, 2, 1, 20, 32, seed=6)
    if case == "bfloat16":
        q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    if case == "grad":
        q.requires_grad_(True)
    if case == "unmasked":
        mask = None
    assert not attention_kernel.fits(q, k, v, mask)
    assert torch.equal(cached_attention(q, k, v, mask), _reference(q, k, v, mask))
