"""The cache of a hybrid trunk: KV for its attention layers, conv and recurrent states for its
Gated DeltaNet layers, and exact rollback inside the last chunk.

    cache = HybridCache(cfg, batch_size, capacity, dtype=..., device=...)   # model.new_cache(...)
    hidden = model(ids, cache, num_new)      # each linear layer stages its states for the chunk
    cache.rollback(lengths)                  # e.g. after a verify: each row keeps only its accepted tokens

A KV cache rolls back by a length change. A recurrent state cannot: verifying K drafts advances
it over K+1 tokens. So every linear layer stages, for the chunk it just read, the state after each
of its positions (a chunk of up to SNAPSHOT_MAX tokens runs token by token) and the conv window
(the last K-1 inputs before the chunk and the chunk's own: the conv state after any position is a
slice of it). `advance` and `rollback` then select, per row, the states after the row's last kept
token. A longer chunk (a long prefill) runs the chunked form and stages only the states before
and after it: a rollback into such a chunk is an error, not a wrong state.
"""

from __future__ import annotations

import torch

from bebop.errors import BebopError
from bebop.model.config import ModelConfig
from bebop.model.kv_cache import KVCache


class LinearStates:
    """conv (B, C, K-1) and recurrent (B, Hv, Dk, Dv, float32) states per linear layer, and what the last chunk
    staged per layer. The states are separate tensors written in place (a compiled step writes the cache's own;
    one stacked buffer would be copied whole at each layer's write)."""

    def __init__(self, conv: list[torch.Tensor], recurrent: list[torch.Tensor]) -> None:
        self.conv = conv  # (B, C, K-1) per layer
        self.recurrent = recurrent  # (B, Hv, Dk, Dv) float32 per layer
        n = len(conv)
        self.windows: list[torch.Tensor | None] = [None] * n  # (B, C, K-1+T) per layer
        self.states: list[torch.Tensor | None] = [None] * n  # (B, T+1, ...) or (B, 2, ...) per layer
        self.every_position = True

    @classmethod
    def zeros(cls, cfg: ModelConfig, batch_size: int, *, dtype: torch.dtype, device: torch.device | str) -> LinearStates:
        n, hv = len(cfg.linear_layers), cfg.linear_num_value_heads
        conv_dim = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim + hv * cfg.linear_value_head_dim
        conv = [torch.zeros(batch_size, conv_dim, cfg.linear_conv_kernel_dim - 1, dtype=dtype, device=device)
                for _ in range(n)]
        recurrent = [torch.zeros(batch_size, hv, cfg.linear_key_head_dim, cfg.linear_value_head_dim,
                                 dtype=torch.float32, device=device) for _ in range(n)]
        return cls(conv, recurrent)

    def state(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.conv[slot], self.recurrent[slot]

    def stage(self, slot: int, window: torch.Tensor, states: torch.Tensor, *, every_position: bool) -> None:
        """A layer's chunk: its conv window (B, C, K-1+T) and states (B, T+1 or 2, Hv, Dk, Dv)."""
        self.windows[slot], self.states[slot] = window, states
        self.every_position = every_position

    def select(self, kept: torch.Tensor, whole: torch.Tensor) -> None:
        """Set each row's states to those after its first kept[b] (B,) tokens of the staged chunk;
        whole (B,): the tokens a row took in that chunk (the only position a chunked form knows)."""
        if not self.windows or self.windows[0] is None:  # no linear layers, or no chunk read yet
            return
        rows = torch.arange(kept.shape[0], device=kept.device)
        index = kept
        if not self.every_position:
            if bool(((kept != 0) & (kept != whole)).any()):
                raise BebopError("cannot roll a linear-attention state back inside a chunk of more than "
                                 "SNAPSHOT_MAX tokens (only its start and end are kept)")
            index = (kept == whole).long() * (whole > 0).long()
        width = self.conv[0].shape[-1]
        span = kept[:, None, None] + torch.arange(width, device=kept.device)  # (B, 1, K-1)
        for slot, (window, states) in enumerate(zip(self.windows, self.states)):
            assert window is not None and states is not None
            self.conv[slot].copy_(window.gather(2, span.expand(-1, window.shape[1], -1)))
            self.recurrent[slot].copy_(states[rows, index])

    def copy_rows(self, source: LinearStates, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Rows dst (N,) take the conv and recurrent states of `source`'s rows src (N,)."""
        for mine, theirs in zip(self.conv + self.recurrent, source.conv + source.recurrent):
            mine[dst] = theirs[src]

    def keep(self, rows: torch.Tensor) -> None:
        self.conv = [c.index_select(0, rows) for c in self.conv]
        self.recurrent = [r.index_select(0, rows) for r in self.recurrent]
        self.windows = [None if w is None else w.index_select(0, rows) for w in self.windows]
        self.states = [None if s is None else s.index_select(0, rows) for s in self.states]


class HybridCache(KVCache):
    """A KVCache over the attention layers that also holds `linear` (LinearStates)."""

    def __init__(self, cfg: ModelConfig, batch_size: int, capacity: int, *, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__(len(cfg.attention_layers), batch_size, cfg.num_key_value_heads, cfg.head_dim, capacity,
                         dtype=dtype, device=device)
        self.linear = LinearStates.zeros(cfg, batch_size, dtype=dtype, device=device)
        self.base = self.lengths.clone()  # (B,) lengths before the last chunk
        self.taken = torch.zeros_like(self.lengths)  # (B,) tokens each row took in the last chunk

    def advance(self, num_new: torch.Tensor, chunk_len: int) -> None:
        self.base.copy_(self.lengths)  # in place, as a compiled step's view does (static_cache.HybridStaticView)
        self.taken.copy_(num_new)
        super().advance(num_new, chunk_len)
        self.linear.select(num_new, self.taken)

    def rollback(self, lengths: torch.Tensor, span: int | None = None) -> None:
        kept = lengths.to(self.lengths.device) - self.base  # (B,)
        if bool(((kept < 0) | (kept > self.taken)).any()):
            raise BebopError("a hybrid cache rolls back only inside its last chunk (the recurrent state of "
                             "earlier positions is gone)")
        super().rollback(lengths, span)
        self.linear.select(kept, self.taken)

    def copy_rows(self, source: KVCache, sources: list[int], targets: list[int], width: int) -> None:
        """KVCache.copy_rows, the linear layers' states too; the copied rows start a new chunk (no rollback
        into what they copied)."""
        assert isinstance(source, HybridCache), type(source)
        super().copy_rows(source, sources, targets, width)
        src = torch.tensor(sources, dtype=torch.long, device=self.lengths.device)  # (N,)
        dst = torch.tensor(targets, dtype=torch.long, device=self.lengths.device)  # (N,)
        self.linear.copy_rows(source.linear, src, dst)
        self.base[dst] = self.lengths[dst]
        self.taken[dst] = 0

    def keep(self, rows: torch.Tensor, span: int) -> None:
        super().keep(rows, span)
        self.linear.keep(rows)
        self.base, self.taken = self.base.index_select(0, rows), self.taken.index_select(0, rows)
