"""A preallocated KV cache with one length per row.

Every forward call appends a chunk of `T` new tokens to each row at that row's own offset
(`lengths[b]`): a ragged prefill, a one-token decode, or a K+1-token verification all use the
same call. Row b keeps only its first `num_new[b]` tokens of the chunk; the rest are written
past its length and are invisible. Rolling back is `rollback(new_lengths)`: a length change, no
copy. Later rows may advance by different amounts (speculative decoding). Rows that finish
leave with `compact(order)` (the live batch: kept rows from the batch's end move into the places of those
that left), so later forwards cost the live rows only; `keep(rows)` gathers any rows, repeats allowed.

`span` is a host-side upper bound on max(lengths), kept so that attention reads only the used
part of the buffer without a device->host sync. Callers that know a tighter bound pass it.
"""

from __future__ import annotations

import torch

from bebop.errors import BebopError
from bebop.model.host_tensor import host_tensor
from bebop.model.rope import rope_table

# a compaction moving at most this many rows copies them in one foreach call (a view per row and layer), more with a
# gather and a copy per layer: the first is the faster for one or two rows, the second from about three
# (docs/benchmarks.md)
FOREACH_ROWS = 2


class KVCache:
    def __init__(self, num_layers: int, batch_size: int, num_kv_heads: int, head_dim: int,
                 capacity: int, *, dtype: torch.dtype, device: torch.device | str) -> None:
        shape = (batch_size, num_kv_heads, capacity, head_dim)
        # one tensor per layer, (B, Hkv, S, Dh) each: a compiled step writes each in place (a slice of one
        # (L, ...) buffer would be copied whole by every layer's write, bebop.model.static_cache)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)  # (B,)
        self.capacity = capacity
        self.span = 0

    @property
    def batch_size(self) -> int:
        return self.lengths.shape[0]

    def positions(self, chunk_len: int) -> torch.Tensor:
        """Absolute positions of a new chunk: (B, T) = lengths[:, None] + arange(T)."""
        self.check_room(chunk_len)
        steps = torch.arange(chunk_len, device=self.lengths.device)
        return self.lengths[:, None] + steps  # (B, T)

    def check_room(self, chunk_len: int) -> None:
        """A chunk of `chunk_len` more tokens fits every row (a host-side check on the span)."""
        if self.span + chunk_len > self.capacity:
            raise BebopError(f"KV cache overflow: {self.span} + {chunk_len} tokens > capacity {self.capacity}")

    def write(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, Hkv, T, Dh) at `positions` (B, T); return this layer's used (B, Hkv, S, Dh)."""
        # index_put_ writes in place, eager and under inductor; a scatter_ copied the layer's whole buffer (twice
        # in bfloat16 on CPU)
        rows = torch.arange(k.shape[0], device=k.device)[:, None]  # (B, 1)
        self.k[layer][rows, :, positions] = k.transpose(1, 2)  # [b, :, pos[b, t]] <- (B, T, Hkv, Dh)
        self.v[layer][rows, :, positions] = v.transpose(1, 2)
        s = self.key_span(k.shape[2])
        return self.k[layer][:, :, :s], self.v[layer][:, :, :s]

    def rope_table(self, rotary_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (N, Dr), N >= capacity: the rotary table this cache's positions index (rope.rope_table)."""
        return rope_table(rotary_dim, theta, dtype, self.lengths.device, self.capacity)

    def key_span(self, chunk_len: int) -> int:
        """How many key positions a chunk of `chunk_len` new tokens attends over (a host-known int)."""
        return self.span + chunk_len

    def advance(self, num_new: torch.Tensor, chunk_len: int) -> None:
        """After a forward: each row keeps num_new[b] (B,) of the chunk's tokens."""
        self.lengths += num_new
        self.span += chunk_len

    def rollback(self, lengths: torch.Tensor | list[int], span: int | None = None, current: bool = False) -> None:
        """Set each row's length (B,) (no copy), from a tensor or a host list. `span`: a known bound on max(lengths),
        else synced. `current`: the device's lengths are `lengths` already (the step that wrote the chunk dropped
        what it rejected), so only the host's span moves."""
        if current:
            self.span = int(max(lengths)) if span is None else span
            return
        if isinstance(lengths, list):
            lengths = host_tensor(lengths, self.lengths.device)
        self.lengths.copy_(lengths)
        self.span = int(lengths.max()) if span is None else span

    def keep(self, rows: torch.Tensor, span: int) -> None:
        """Keep only the cache rows `rows` (R,) (indices into the current batch, in the new order, repeats allowed);
        `span`: a bound on the kept rows' max length (host-known)."""
        self.k = [keep_span(k, rows, span) for k in self.k]  # (R, Hkv, S, Dh) per layer
        self.v = [keep_span(v, rows, span) for v in self.v]
        self._keep_rows(rows)
        self.span = span

    def compact(self, order: list[int], span: int) -> None:
        """Keep only the rows `order` (positions in the current batch, in their new order): a live batch whose
        finished rows leave, each leaving row's place taken by a kept row from past the kept count, so
        `order[i]` is i (the row stays) or at least len(order) (engine/generate.py's `fill_from_end`). Only the
        moved rows are copied, over their used positions (< span, a host-known bound): no new buffers, no
        zeroing. Positions past a row's length keep what the buffer held there (finite values an earlier row
        wrote, or zeros): attention reads them only masked."""
        n = len(order)
        assert len(set(order)) == n and all(r == i or n <= r < self.batch_size for i, r in enumerate(order))
        moved = [i for i, r in enumerate(order) if r != i]
        buffers = self.k + self.v  # sources lie past every destination
        if moved and len(moved) <= FOREACH_ROWS:  # one copy call for every layer and moved row
            torch._foreach_copy_([b[i, :, :span] for b in buffers for i in moved],  # (Hkv, span, Dh) each
                                 [b[order[i], :, :span] for b in buffers for i in moved])
        elif moved:  # a gather and a copy per layer buffer
            device = self.lengths.device
            dst = torch.tensor(moved, dtype=torch.long, device=device)  # (M,)
            src = torch.tensor([order[i] for i in moved], dtype=torch.long, device=device)  # (M,), each >= n
            for buffer in buffers:
                used = buffer[:, :, :span]
                used.index_copy_(0, dst, used.index_select(0, src))
        self.k = [k[:n] for k in self.k]  # (R, Hkv, S, Dh) views of the same storage
        self.v = [v[:n] for v in self.v]
        self._keep_rows(torch.tensor(order, dtype=torch.long, device=self.lengths.device))
        self.span = span

    def _keep_rows(self, rows: torch.Tensor) -> None:
        """The per-row state beside the keys and values, for the rows `rows` (R,)."""
        self.lengths = self.lengths.index_select(0, rows)  # (R,)

    def copy_rows(self, source: KVCache, sources: list[int], targets: list[int], width: int) -> None:
        """Rows `targets` of this cache become rows `sources` of `source` (their first `width` positions and
        lengths): a prefix computed once, copied into every row that shares it. Rows may repeat in `sources`."""
        src = torch.tensor(sources, dtype=torch.long, device=self.lengths.device)  # (N,)
        dst = torch.tensor(targets, dtype=torch.long, device=self.lengths.device)  # (N,)
        for mine, theirs in zip(self.k + self.v, source.k + source.v):
            mine[dst, :, :width] = theirs[src, :, :width]  # (N, Hkv, width, Dh)
        self.lengths[dst] = source.lengths[src]
        self.span = max(self.span, width)


def keep_span(buffer: torch.Tensor, rows: torch.Tensor, span: int) -> torch.Tensor:
    """buffer (B, Hkv, S, Dh) -> (R, Hkv, S, Dh): the rows' used positions (< span) gathered, the rest zeroed,
    not copied (attention reads past a row's length only masked, and a masked zero stays finite)."""
    out = torch.empty((rows.shape[0], *buffer.shape[1:]), dtype=buffer.dtype, device=buffer.device)
    torch.index_select(buffer[:, :, :span], 0, rows, out=out[:, :, :span])
    out[:, :, span:].zero_()
    return out
