"""Trunk positions the MTP head has not consumed yet: the pending refresh (docs/method.md section 3, step 2).

After every trunk forward, each row's newly valid positions (a prefix of its chunk) need an MTP
refresh: the depth-1 input (h_s, e(x_{s+1})) written into the MTP cache at position s. A drafting
step does that refresh first. A step that does not draft (adaptive K chose 0) must not pay for
the head, so its positions wait here; the next drafting step refreshes the whole skipped span in
ONE MTP forward (a ragged chunk per row, in position order).

    log = RefreshLog(batch)
    log.add(hidden, counts, next_tokens)     # hidden (R, T, H); counts[r] valid positions; next tokens
    hidden, tokens, counts = log.take(pad_id)  # (R, W, H), (R, W), (R,) and the log is empty again
"""

from __future__ import annotations

import torch

from bebop.model.host_tensor import pad_chunk


class RefreshLog:
    def __init__(self, batch: int) -> None:
        self.chunks: list[tuple[torch.Tensor, list[int]]] = []  # (hidden (R, T, H), counts per row)
        self.tokens: list[list[int]] = [[] for _ in range(batch)]  # next token of each pending position
        self.width = 0  # sum of the chunks' widths (checked every plain step: kept, not summed)

    @property
    def counts(self) -> list[int]:
        return [len(t) for t in self.tokens]

    @property
    def positions(self) -> int:
        """Logged hidden positions, padding included (what the log holds in memory per row)."""
        return self.width

    def add(self, hidden: torch.Tensor, counts: list[int], next_tokens: list[list[int]]) -> None:
        """hidden (R, T, H): a forward's output; row r's first counts[r] positions became valid,
        and next_tokens[r] (len counts[r]) are the tokens that follow them."""
        assert hidden.shape[0] == len(counts) == len(self.tokens), (hidden.shape, len(counts), len(self.tokens))
        if not any(counts):
            return
        self.chunks.append((hidden, list(counts)))  # the whole chunk: a later take slices it, padding none
        self.width += hidden.shape[1]
        for row, toks in zip(self.tokens, next_tokens):
            row.extend(toks)

    def take(self, pad_id: int, width: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The pending span of every row, left-aligned in position order, at least `width` wide (a decode step's
        refresh padded to k + 1: one compiled shape): hidden (R, W, H) (past a row's count whatever its chunks held
        there, or zeros: finite, and the refresh keeps only a row's first count positions), next tokens (R, W)
        (pad_id past the count) and counts (R,)."""
        used = max(1, max(self.counts))
        hidden = self._gather(max(used, width))  # (R, W, H), W = max(used, width)
        ids, counts = pad_chunk(self.tokens, pad_id, hidden.device, width=width)  # (R, W), (R,)
        self.chunks, self.tokens, self.width = [], [[] for _ in self.tokens], 0
        return hidden, ids, counts

    def _gather(self, width: int) -> torch.Tensor:
        """The logged positions of every row, left-aligned in position order, `width` wide (at least the largest
        count): (R, width, H). A single chunk (a decode step's, k + 1 wide) is sliced, not copied."""
        if len(self.chunks) == 1:  # a decode step's chunk, k + 1 wide: sliced, not copied
            hidden = self.chunks[0][0][:, :width]
        else:
            hidden = torch.cat([h for h, _ in self.chunks], dim=1)  # (R, sum T, H)
            valid = torch.cat([torch.arange(h.shape[1])[None, :] < torch.tensor(c)[:, None] for h, c in self.chunks],
                              dim=1)  # (R, sum T) on the host: counts are host-known
            order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices[:, :width]  # valid first
            order = order.to(hidden.device)[..., None].expand(-1, -1, hidden.shape[-1])  # (R, <= W, H)
            hidden = hidden.gather(1, order)
        if hidden.shape[1] < width:
            hidden = torch.nn.functional.pad(hidden, (0, 0, 0, width - hidden.shape[1]))  # (R, width, H)
        return hidden

    def keep(self, rows: list[int]) -> None:
        """Keep only the rows `rows` (positions in the current batch), in that order."""
        index = None
        kept = []
        for hidden, counts in self.chunks:
            if index is None:
                index = torch.tensor(rows, dtype=torch.long, device=hidden.device)
            kept.append((hidden.index_select(0, index), [counts[r] for r in rows]))
        self.chunks = [(h, c) for h, c in kept if any(c)]
        self.width = sum(h.shape[1] for h, _ in self.chunks)
        self.tokens = [self.tokens[r] for r in rows]
