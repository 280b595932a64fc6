"""The KV cache as a compiled step sees it: per-layer tensors, attention over all of them by length.

    view = StaticView(k, v, cache.lengths, rope)   # inside the compiled function; k, v: views of the used span
    hidden = model(ids, view, num_new)             # writes in place, lengths += num_new
    view = HybridStaticView(k, v, cache.lengths, rope, conv, recurrent, base, taken, staging)   # a hybrid's

A KVCache attends over its used span, a host-side int that grows every step: a graph that read it
would specialise on it and recompile every step. The view reads no host state: the chunk attends
over its tensors' whole length (the engine passes views of the used span, a dynamic dimension),
keys past a row's length masked as in the eager cache, so one graph serves every step. Its tensors
ARE the cache's: writes and the length update land in the KVCache the engine holds, which keeps
its own host span for the eager forwards in between. The rotary table (`rope`, cos and sin) comes in too: a
graph that looked it up in the module's table would hold a guard on module state, which a graph saved for
another process cannot (engine/step_packages.py). The engine checks capacity on the host
before each compiled call (`KVCache.check_room`, as an eager forward does); the view cannot raise
from inside a graph.
"""

from __future__ import annotations

import torch

from bebop.model.hybrid_cache import LinearStates
from bebop.model.kv_cache import KVCache


def same_rows(lengths: torch.Tensor, tensors) -> None:
    """Tell a graph being traced that every tensor in `tensors` has the rows of `lengths` (B,) in dimension 0. A
    dynamic dimension is one symbol per tensor unless the graph knows it is equal to another, and every symbol is
    an argument of every call and a guard of it: told, the batch is one symbol however many tensors carry it."""
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.dim():
            torch._check(t.shape[0] == lengths.shape[0])


class StaticView(KVCache):
    def __init__(self, k: list[torch.Tensor], v: list[torch.Tensor], lengths: torch.Tensor,
                 rope: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.k = k  # (B, Hkv, S, Dh) per layer: the KVCache's own tensors, written in place
        self.v = v  # (B, Hkv, S, Dh) per layer
        self.lengths = lengths  # (B,), updated in place
        self.capacity = k[0].shape[2]
        self.rope = rope  # cos, sin (N, Dr), N >= the cache's capacity
        same_rows(lengths, k + v)
        for t in k[1:] + v:  # one span and one buffer layout in the graph, not one per layer
            torch._check(t.shape[2] == self.capacity)
            for dim in range(2):  # the buffer's capacity, in its strides
                torch._check(t.stride(dim) == k[0].stride(dim))

    def rope_table(self, rotary_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rope

    def check_room(self, chunk_len: int) -> None:
        """Checked by the engine on the host before the call (`KVCache.check_room`)."""

    def key_span(self, chunk_len: int) -> int:
        """The whole buffer: KVCache.write returns it (a slice of its full length) for the mask to cut."""
        return self.capacity

    def advance(self, num_new: torch.Tensor, chunk_len: int) -> None:
        self.lengths.add_(num_new)


class HybridStaticView(StaticView):
    """A hybrid trunk's cache as a compiled step sees it: the attention layers' view, the linear layers' conv and
    recurrent states (the HybridCache's own tensors, read), its `base` / `taken` (B,), updated in place, and the
    storage the chunk writes its states into (LinearStates.stagings: kept from step to step). What the
    chunk staged (`linear.windows`, `.states`, `.initials`) the step returns, and the engine hands it to the
    HybridCache, which selects each row's states from it on the host as after an eager chunk: a one-token chunk's
    states become the recurrent states without a copy, where a selection inside the graph would copy them into the
    cache's tensors and keep a copy of the states before the chunk for a rollback."""

    def __init__(self, k: list[torch.Tensor], v: list[torch.Tensor], lengths: torch.Tensor,
                 rope: tuple[torch.Tensor, torch.Tensor], conv: list[torch.Tensor], recurrent: list[torch.Tensor],
                 base: torch.Tensor, taken: torch.Tensor, staging: list[torch.Tensor]) -> None:
        super().__init__(k, v, lengths, rope)
        same_rows(lengths, [*conv, *recurrent, base, taken])
        assert all(s.shape[1:] == r.shape for s, r in zip(staging, recurrent)), "staging: (T, B, Hv, Dk, Dv) a layer"
        self.linear = LinearStates(conv, recurrent)
        self.linear.given = staging  # where the chunk writes its states (the cache's kept storage), or none
        self.base, self.taken = base, taken  # (B,) each, updated in place

    def advance(self, num_new: torch.Tensor, chunk_len: int) -> None:
        super().advance(num_new, chunk_len)
        # base from the advanced lengths, not a copy of them taken before: inductor writes a graph's mutated inputs
        # back after the graph, and a copy aliasing `lengths` would read the advanced value
        self.base.copy_(self.lengths - num_new)
        self.taken.copy_(num_new)  # the engine selects from what the chunk staged, after the graph

    def staged(self) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None], list[torch.Tensor | None]]:
        return self.linear.windows, self.linear.states, self.linear.initials
