"""Prefill: every prompt's tokens but its last written into the caches, each distinct prompt once.

    lengths = prefill(model, prompts, cache)                       # plain decoding
    lengths = prefill(model, prompts, cache, mtp_cache=head_cache)  # speculative: the head's cache too
    lengths = prefill(model, prompts, cache, steps=prepared_steps(model))  # the engine call's (compiled) forwards

A GRPO batch is `batch_prompts` prompts each repeated `group_size` times, so most rows of a rollout
share their prompt with others. Prefilling each row would run the same forward group_size times
(and pad every row to the longest prompt of the batch). Here the distinct prompt prefixes are
prefilled once each, in length buckets (rows of similar length share a forward, so padding stays a
small fraction of the tokens), and their cache rows are copied into every row that holds the same
prompt: vLLM's and SGLang's prefix caching, with the groups found by comparing token lists rather
than hashing cache blocks. A hybrid trunk's conv and recurrent states are copied with its KV rows.

What is prefilled is the prompt less its last token: that token is fed by the decoding loop's first
step (a one-token decode step, the compiled graph's), whose logits sample the first new token, so the
random draws of a run are those of feeding the whole prompt in its first step. With `mtp_cache`, the
head is refreshed over the same positions (the depth-1 input at position s is (h_s, x_{s+1}): both in
the prompt), so the first drafting step refreshes only the positions decoded since.

The forwards are `steps`' (engine/compiled.py: the engine call's step functions, eager by default): with
`--compile` a prefill runs the graph of the trunk's chunks (one for every width and batch) and the head's own,
whose fused kernels cost a fraction of an eager forward's op-by-op calls (docs/benchmarks.md).

The rows' logits equal those of a per-row prefill up to float rounding (a row's own positions only are
attended; tests/test_prefill.py). Returns each row's prefilled length (B,) as host ints.
"""

from __future__ import annotations

from collections.abc import Sequence

from bebop.engine.compiled import EAGER, EagerSteps
from bebop.model.host_tensor import pad_chunk
from bebop.model.kv_cache import KVCache
from bebop.model.qwen3 import CausalLM

PAD_SHARE = 0.25  # a bucket grows while its padding stays under this share of its tokens
MAX_BUCKET_TOKENS = 16_384  # rows x width of one prefill forward (bounds its activations)


def prefill(model: CausalLM, prompts: Sequence[Sequence[int]], cache: KVCache, *,
            mtp_cache: KVCache | None = None, pad_id: int = 0, steps: EagerSteps = EAGER) -> list[int]:
    """Write prompts[b][:-1] into row b of `cache` (and of `mtp_cache`), each distinct prompt computed once;
    the caches must be empty and have len(prompts) rows. -> prefilled length of each row."""
    assert cache.batch_size == len(prompts) and cache.span == 0, (cache.batch_size, len(prompts), cache.span)
    keys = [tuple(p) for p in prompts]
    # longest first; prompts of one length in the rows' order, so that a batch of distinct prompts of one length
    # maps onto its own rows (the cache takes the prefill's states without copying them)
    distinct = sorted(dict.fromkeys(p for p in keys if len(p) > 1), key=len, reverse=True)
    lengths = [len(p) - 1 for p in keys]
    if not distinct:
        return lengths
    where = {p: i for i, p in enumerate(distinct)}  # prompt -> its row among the distinct
    for bucket in buckets([len(p) - 1 for p in distinct]):
        rows = [distinct[i] for i in bucket]
        width = len(rows[0]) - 1
        ids, counts = pad_chunk([r[:-1] for r in rows], pad_id, model.device, width)  # (D, W) the prefixes, (D,)
        scratch = model.new_cache(len(rows), width, rollback=False)  # its rows are copied, never rolled back
        hidden = steps.forward(model, ids, scratch, counts)  # (D, W, H)
        targets = [b for b, p in enumerate(keys) if len(p) > 1 and where[p] in bucket]
        sources = [bucket.index(where[keys[b]]) for b in targets]
        cache.copy_rows(scratch, sources, targets, width)
        if mtp_cache is not None:  # the head's depth-1 input at s is (h_s, x_{s+1}): x_{s+1} is in the prompt
            nexts, _ = pad_chunk([r[1:] for r in rows], pad_id, model.device, width)  # (D, W)
            head_scratch = model.require_mtp().new_cache(len(rows), width, dtype=model.dtype, device=model.device)
            steps.head_forward(model, head_scratch, hidden, nexts, counts)
            mtp_cache.copy_rows(head_scratch, sources, targets, width)
    return lengths


def buckets(lengths: list[int]) -> list[list[int]]:
    """Indices of `lengths` (sorted longest first) grouped into prefill forwards: a bucket takes the next
    length while its padding stays under PAD_SHARE of its tokens and its rows x width under
    MAX_BUCKET_TOKENS."""
    out: list[list[int]] = []
    for i, n in enumerate(lengths):
        if out:
            bucket = out[-1]
            width = lengths[bucket[0]]
            rows = len(bucket) + 1
            real = sum(lengths[j] for j in bucket) + n
            if rows * width <= MAX_BUCKET_TOKENS and rows * width - real <= PAD_SHARE * rows * width:
                bucket.append(i)
                continue
        out.append([i])
    return out
