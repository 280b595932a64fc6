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
from bebop.model.gated_deltanet import SNAPSHOT_MAX
from bebop.model.host_tensor import host_tensor
from bebop.model.kv_cache import KVCache

STATE_DTYPES = (torch.float32, torch.bfloat16)  # what a recurrent state may be kept in (CausalLM.state_dtype)


class LinearStates:
    """conv (B, C, K-1) and recurrent (B, Hv, Dk, Dv; float32 or bfloat16) states per linear layer, what the last chunk
    staged per layer: its conv window, the states after its positions and the state before it. The states are
    separate tensors, so that `select` hands a row-complete one-token chunk's states over without a copy (after an
    eager chunk, and after a compiled one, whose graph returns what it staged)."""

    def __init__(self, conv: list[torch.Tensor], recurrent: list[torch.Tensor], *, snapshots: bool = True) -> None:
        self.snapshots = snapshots  # whether a short chunk keeps every position's state (False: a prefill's scratch)
        self.conv = conv  # (B, C, K-1) per layer
        self.recurrent = recurrent  # (B, Hv, Dk, Dv) per layer, in STATE_DTYPES
        n = len(conv)
        self.windows: list[torch.Tensor | None] = [None] * n  # (B, C, K-1+T) per layer
        self.states: list[torch.Tensor | None] = [None] * n  # (T, B, ...) after each position, or (1, B, ...) its end
        self.initials: list[torch.Tensor | None] = [None] * n  # (B, Hv, Dk, Dv): the state before the chunk
        self.every_position = True
        self.at_whole = False  # whether the states are each row's after its whole last chunk (select(whole, whole))
        # storage a short chunk's states are written into, kept from step to step (a new (T, B, Hv, Dk,
        # Dv) tensor each step is tens of MB at 64 rows, which the allocator maps afresh): per layer a pair for
        # one-token chunks, whose states become the recurrent state in turn, and one for longer chunks
        self.buffers: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self.given: list[torch.Tensor] = []  # in a compiled step's view: each layer's staging, passed in (or none)

    @classmethod
    def zeros(cls, cfg: ModelConfig, batch_size: int, *, dtype: torch.dtype, device: torch.device | str,
              snapshots: bool = True, state_dtype: torch.dtype = torch.float32) -> LinearStates:
        """dtype: the conv states' (the model's); state_dtype: the recurrent states' (STATE_DTYPES)."""
        if state_dtype not in STATE_DTYPES:
            raise BebopError(f"a linear layer's recurrent state is kept in float32 or bfloat16, not {state_dtype}")
        n, hv = len(cfg.linear_layers), cfg.linear_num_value_heads
        conv_dim = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim + hv * cfg.linear_value_head_dim
        conv = [torch.zeros(batch_size, conv_dim, cfg.linear_conv_kernel_dim - 1, dtype=dtype, device=device)
                for _ in range(n)]
        recurrent = [torch.zeros(batch_size, hv, cfg.linear_key_head_dim, cfg.linear_value_head_dim,
                                 dtype=state_dtype, device=device) for _ in range(n)]
        return cls(conv, recurrent, snapshots=snapshots)

    def state(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.conv[slot], self.recurrent[slot]

    def staging(self, slot: int, t: int) -> torch.Tensor | None:
        """Where a chunk of t tokens writes its states (t, B, Hv, Dk, Dv): a view of kept storage that the
        layer's recurrent state does not live in. Inside a compiled graph: the view the step was given (the host
        took it from here before the graph, see `stagings`), or None (the graph allocates its own)."""
        if torch.compiler.is_compiling():
            return self.given[slot] if self.given else None
        return self._kept(slot, t)

    def _kept(self, slot: int, t: int) -> torch.Tensor:
        """staging's view of kept storage (on the host)."""
        recurrent = self.recurrent[slot]  # (B, Hv, Dk, Dv)
        kept = self.buffers[slot]
        if not kept:
            kept += [recurrent.new_empty(0) for _ in range(3)]  # a one-token pair, then longer chunks'
        if t > 1:
            i = 2
        else:  # the one of the pair the recurrent state does not live in
            i = int(kept[0].untyped_storage().data_ptr() == recurrent.untyped_storage().data_ptr())
        need = recurrent.numel() * t
        if kept[i].numel() < need:
            kept[i] = recurrent.new_empty(need)
        return kept[i][:need].view(t, *recurrent.shape)

    def stagings(self, t: int) -> list[torch.Tensor]:
        """Every layer's staging for a chunk of t tokens: what a compiled step is given, so that its graph writes the
        states into kept storage, as an eager chunk does (none where the chunk keeps only its end)."""
        if not self.snapshots or t > SNAPSHOT_MAX:
            return []
        return [self._kept(slot, t) for slot in range(len(self.conv))]

    def stage(self, slot: int, window: torch.Tensor, states: torch.Tensor, initial: torch.Tensor, *,
              every_position: bool) -> None:
        """A layer's chunk: its conv window (B, C, K-1+T), states (T or 1, B, Hv, Dk, Dv) and the state before it
        (B, Hv, Dk, Dv), which is the recurrent state itself (no chunk writes into that: `select` replaces it)."""
        self.windows[slot], self.states[slot], self.initials[slot] = window, states, initial
        self.every_position = every_position

    def select(self, kept: torch.Tensor, whole: torch.Tensor) -> None:
        """Set each row's states to those after its first kept[b] (B,) tokens of the staged chunk;
        whole (B,): the tokens a row took in that chunk (the only position a chunked form knows)."""
        if not self.windows or self.windows[0] is None:  # no linear layers, or no chunk read yet
            return
        self.at_whole = kept is whole
        rows = torch.arange(kept.shape[0], device=kept.device)
        if self.every_position:
            index = (kept - 1).clamp(min=0)  # (B,): position kept - 1 of the chunk's states
        else:
            if bool(((kept != 0) & (kept != whole)).any()):
                raise BebopError("cannot roll a linear-attention state back inside a chunk of more than "
                                 "SNAPSHOT_MAX tokens (only its start and end are kept)")
            index = torch.zeros_like(kept)  # the chunk's end
        moved = kept > 0  # (B,): rows whose state is one of the chunk's (else the state before it)
        width = self.conv[0].shape[-1]
        chunk = self.windows[0].shape[-1] - width  # T
        every_row, all_of_it = torch.stack([moved.all(), (kept == chunk).all()]).tolist()  # one host read
        span = kept[:, None, None] + torch.arange(width, device=kept.device)  # (B, 1, K-1)
        for slot, (window, states, initial) in enumerate(zip(self.windows, self.states, self.initials)):
            assert window is not None and states is not None and initial is not None
            # (B, C, K-1): each row's last K-1 inputs; where every row took the whole chunk, the window's end
            self.conv[slot] = (window[:, :, chunk:].contiguous() if all_of_it
                               else window.gather(2, span.expand(-1, window.shape[1], -1)))
            if every_row and states.shape[0] == 1:
                self.recurrent[slot] = states[0]  # (B, Hv, Dk, Dv), contiguous: no copy
            elif every_row:  # one gather, no temporary
                self.recurrent[slot] = states.flatten(0, 1).index_select(0, index * states.shape[1] + rows)
            else:
                self.recurrent[slot] = torch.where(moved[:, None, None, None], states[index, rows], initial)

    def copy_rows(self, source: LinearStates, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Rows dst (N,) take the conv and recurrent states of `source`'s rows src (N,). Where dst is every row (a
        prefill's copy into a new batch), each state is one gather of source's rows, not a gather and a scatter, and
        where source's rows are these rows in order, its tensors are taken as they are: `source` is a prefill's
        scratch, which nothing uses after."""
        batch = self.conv[0].shape[0] if self.conv else 0
        if len(dst) == batch and bool((torch.bincount(dst, minlength=batch) == 1).all()):
            order = torch.empty_like(src)
            order[dst] = src  # (B,): the source row of each row
            assert [x.dtype for x in self.recurrent] == [x.dtype for x in source.recurrent]
            if source.conv[0].shape[0] == batch and bool((order == torch.arange(batch, device=order.device)).all()):
                self.conv, self.recurrent = list(source.conv), list(source.recurrent)
            else:
                self.conv = [c.index_select(0, order) for c in source.conv]
                self.recurrent = [r.index_select(0, order) for r in source.recurrent]
            return
        for mine, theirs in zip(self.conv + self.recurrent, source.conv + source.recurrent):
            mine[dst] = theirs[src]

    def keep(self, rows: torch.Tensor) -> None:
        self.conv = [c.index_select(0, rows) for c in self.conv]
        self.recurrent = [r.index_select(0, rows) for r in self.recurrent]
        self.windows = [None if w is None else w.index_select(0, rows) for w in self.windows]
        self.states = [None if s is None else s.index_select(1, rows) for s in self.states]
        self.initials = [None if s is None else s.index_select(0, rows) for s in self.initials]


class HybridCache(KVCache):
    """A KVCache over the attention layers that also holds `linear` (LinearStates)."""

    def __init__(self, cfg: ModelConfig, batch_size: int, capacity: int, *, dtype: torch.dtype,
                 device: torch.device | str, rollback: bool = True, state_dtype: torch.dtype = torch.float32) -> None:
        super().__init__(len(cfg.attention_layers), batch_size, cfg.num_key_value_heads, cfg.head_dim, capacity,
                         dtype=dtype, device=device)
        # rollback=False: no chunk is ever rolled back into (a prefill's scratch), so chunks keep only their ends
        self.linear = LinearStates.zeros(cfg, batch_size, dtype=dtype, device=device, snapshots=rollback,
                                         state_dtype=state_dtype)
        self.base = self.lengths.clone()  # (B,) lengths before the last chunk
        self.taken = torch.zeros_like(self.lengths)  # (B,) tokens each row took in the last chunk

    def advance(self, num_new: torch.Tensor, chunk_len: int) -> None:
        self.base.copy_(self.lengths)  # in place, as a compiled step's view does (static_cache.HybridStaticView)
        self.taken.copy_(num_new)
        super().advance(num_new, chunk_len)
        self.linear.select(self.taken, self.taken)

    def rollback(self, lengths: torch.Tensor | list[int], span: int | None = None, current: bool = False) -> None:
        """KVCache.rollback; the linear layers' states select each row's kept position, `current` or not."""
        device = self.lengths.device
        lengths = host_tensor(lengths, device) if isinstance(lengths, list) else lengths.to(device)
        kept = lengths - self.base  # (B,)
        outside, whole = torch.stack([((kept < 0) | (kept > self.taken)).any(), (kept == self.taken).all()]).tolist()
        if outside:
            raise BebopError("a hybrid cache rolls back only inside its last chunk (the recurrent state of "
                             "earlier positions is gone)")
        super().rollback(lengths, span)
        if not (whole and self.linear.at_whole):  # else the states `advance` selected, each row's whole chunk
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

    def _keep_rows(self, rows: torch.Tensor) -> None:
        super()._keep_rows(rows)
        self.linear.keep(rows)
        self.base, self.taken = self.base.index_select(0, rows), self.taken.index_select(0, rows)
