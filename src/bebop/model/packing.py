"""Rows that share prompts, packed into one sequence for a training forward: each distinct prompt's tokens
once, then every row's continuation, no padding.

    packing = pack(prompts, continuations)     # prompts: G id tensors (P_g,); continuations: (prompt g, ids (C_r,))
    hidden = model(packing.ids, packing=packing)   # (1, N, H), N = sum P_g + sum C_r
    logits = model.logits(hidden[0, packing.outputs])   # (M, V): each row's predictions, row after row

A GRPO group is one prompt sampled G times: a padded batch runs the prompt's tokens through every layer G
times and every row to the longest row's length. Packed, the projections and MLPs run on exactly the tokens
there are; attention runs per segment, each padded only to its set's longest: a prompt's tokens over
themselves, causally, and a row's continuation over its prompt's keys and its own earlier tokens. The math
is the padded forward's, row by row (a key is visible iff its position is at most the query's, in the row's
own sequence); gradients from every row of a group meet in the prompt's one copy, as they sum in the shared
weights of the padded forward.

A linear (Gated DeltaNet) layer runs along rows instead (`Rows`): each prompt from a zero state, each
continuation from its prompt's final recurrent state and last conv inputs, so a group's rows share the prompt's
recurrence as they share its keys.

Outputs: row r's predictions are its prompt's last token's (predicting the continuation's first token) and
then its continuation's tokens', in order: `1 + C_r` of them, rows in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from bebop.errors import BebopError

_NEVER = 1 << 30  # the position of a padded key: after every query
SPREAD = 1.5  # a set of segments spans key counts up to this ratio
_Part = tuple[list[int], list[int], list[int], list[int]]  # query flat indices, their positions, key indices, positions


@dataclass
class Segments:
    """One set of attention segments of a packed sequence, each padded to the set's longest: segment s's
    queries at flat indices `query[s]` attend to its keys at `key[s]` where `mask[s]`."""

    query: Tensor  # (S, Q) long: flat index of each query (0 where padding)
    key: Tensor  # (S, K) long: flat index of each key (0 where padding)
    mask: Tensor  # (S, 1, Q, K) bool: the key's position <= the query's; a padded query sees key 0 (no empty row)


@dataclass
class Rows:
    """A packed sequence as padded rows, for a layer that runs along each row (a linear layer's recurrence):
    each prompt from the start, each non-empty continuation from its prompt's end."""

    prompts: Tensor  # (G, P) long: flat index of each prompt's tokens, right-padded with 0
    prompt_lens: Tensor  # (G,) long
    continuations: Tensor  # (R, C) long: flat index of each non-empty continuation's tokens, right-padded with 0
    continuation_lens: Tensor  # (R,) long
    continuation_prompt: Tensor  # (R,) long: its prompt's index
    places: Tensor  # (N,) long: token i's place in the prompts' then the continuations' rows, flattened


@dataclass
class Packing:
    ids: Tensor  # (1, N) token ids: the prompts, then the continuations
    positions: Tensor  # (1, N) each token's position in its own row's sequence
    segments: list[Segments]  # each prompt over itself and each row's continuation over its prompt and itself,
    #   in sets of similar lengths
    places: Tensor  # (N,) long: token i's place among the sets' queries, each set flattened, sets in order
    outputs: Tensor  # (M,) flat indices whose hidden states the rows' predictions read, M = sum (1 + C_r)
    output_rows: Tensor  # (M,) the row each output belongs to
    output_steps: Tensor  # (M,) its place in its row: 0 its prompt's last token, j its continuation's token j - 1
    rows: Rows  # the same tokens as padded rows


def pack(prompts: Sequence[Tensor], continuations: Sequence[tuple[int, Tensor]]) -> Packing:
    """prompts: G 1-D id tensors (each at least one token); continuations: one (prompt index, 1-D ids) per row,
    the ids possibly empty (a row predicting only its first token). See the module's docstring."""
    if not prompts or any(p.dim() != 1 or p.numel() == 0 for p in prompts):
        raise BebopError("pack: every prompt must be a non-empty 1-D id tensor")
    device = prompts[0].device
    p_lens = [int(p.numel()) for p in prompts]
    p_starts = _starts(p_lens, 0)
    c_lens = [int(ids.numel()) for _, ids in continuations]
    c_starts = _starts(c_lens, sum(p_lens))
    arange = lambda n, start=0: list(range(start, start + n))  # noqa: E731
    prompt_parts = [(arange(n, s), arange(n), arange(n, s), arange(n)) for s, n in zip(p_starts, p_lens, strict=True)]
    cont_parts, positions = [], [pos for _, pos, _, _ in prompt_parts]
    for (g, _), start, n in zip(continuations, c_starts, c_lens, strict=True):
        if not 0 <= g < len(prompts):
            raise BebopError(f"pack: a continuation names prompt {g} of {len(prompts)}")
        own = arange(n, p_lens[g])  # the continuation's positions in its row
        positions.append(own)
        if n:
            cont_parts.append((arange(n, start), own, arange(p_lens[g], p_starts[g]) + arange(n, start),
                               arange(p_lens[g] + n)))
    segments, reals = zip(*(_segments(parts, device) for parts in _similar(prompt_parts + cont_parts)), strict=True)
    outputs, rows, steps = [], [], []
    for r, ((g, _), start, n) in enumerate(zip(continuations, c_starts, c_lens, strict=True)):
        outputs += [p_starts[g] + p_lens[g] - 1, *arange(n, start)]
        rows += [r] * (n + 1)
        steps += arange(n + 1)
    tensor = lambda xs: torch.tensor(xs, dtype=torch.long, device=device)  # noqa: E731
    ids = torch.cat([*prompts, *(c for _, c in continuations)]).to(device)  # (N,)
    spans = [(s, n, g) for (g, _), s, n in zip(continuations, c_starts, c_lens, strict=True) if n]
    return Packing(ids[None], tensor([p for part in positions for p in part])[None], list(segments),
                   _places([seg.query for seg in segments], list(reals)), tensor(outputs), tensor(rows), tensor(steps),
                   _rows(list(zip(p_starts, p_lens, strict=True)), spans, device))


def _rows(prompts: list[tuple[int, int]], continuations: list[tuple[int, int, int]], device: torch.device) -> Rows:
    """prompts: (flat start, length); continuations: (flat start, length, prompt index), each length >= 1."""
    def padded(spans: list[tuple[int, int]]) -> tuple[Tensor, Tensor, Tensor]:
        """-> the spans' flat indices (S, T) right-padded, their lengths (S,), the real entries' places (R,)."""
        width = max((n for _, n in spans), default=1)
        index = torch.zeros(len(spans), width, dtype=torch.long)
        for i, (start, n) in enumerate(spans):
            index[i, :n] = torch.arange(start, start + n)
        lens = torch.tensor([n for _, n in spans], dtype=torch.long)
        return index, lens, (torch.arange(width)[None] < lens[:, None]).flatten().nonzero().squeeze(1)

    p_index, p_lens, p_real = padded(prompts)
    c_index, c_lens, c_real = padded([(s, n) for s, n, _ in continuations])
    prompt = torch.tensor([g for _, _, g in continuations], dtype=torch.long)
    return Rows(p_index.to(device), p_lens.to(device), c_index.to(device), c_lens.to(device), prompt.to(device),
                _places([p_index, c_index], [p_real, c_real]).to(device))


def _places(indexes: list[Tensor], reals: list[Tensor]) -> Tensor:
    """Padded flat-index tensors (each (S, T)) and their real entries' places (each flattened) -> (N,) each flat
    token's place in their concatenation, each flattened: a layer's padded outputs, so concatenated, gathered at it
    come back in the packed sequence's order (every token is exactly one real entry)."""
    offsets = [0]
    for index in indexes[:-1]:
        offsets.append(offsets[-1] + index.numel())
    real = torch.cat([offset + places for offset, places in zip(offsets, reals, strict=True)])  # (N,)
    flat = torch.cat([index.flatten() for index in indexes])[real]  # (N,) the flat token at each real place
    return real[torch.argsort(flat)]


def _starts(lengths: list[int], first: int) -> list[int]:
    starts, at = [], first
    for n in lengths:
        starts.append(at)
        at += n
    return starts


def _similar(parts: list[_Part]) -> list[list[_Part]]:
    """The segments in sets of similar key counts (a set's longest at most SPREAD x its shortest), shortest
    first: a set pads every segment to its longest, so a long tail's rows pad only each other."""
    sets: list[list[_Part]] = []
    for part in sorted(parts, key=lambda part: len(part[2])):
        if not sets or len(part[2]) > SPREAD * len(sets[-1][0][2]):
            sets.append([])
        sets[-1].append(part)
    return sets


def _segments(parts: list[_Part], device: torch.device) -> tuple[Segments, Tensor]:
    """parts: per segment (query flat indices, query positions, key flat indices, key positions) -> Segments, and
    the real queries' places (R,) in its (S * Q) flattened queries."""
    s = len(parts)
    q_len = max((len(q) for q, *_ in parts), default=1)
    k_len = max((len(k) for _, _, k, _ in parts), default=1)
    query = torch.zeros(s, q_len, dtype=torch.long)
    key = torch.zeros(s, k_len, dtype=torch.long)
    q_pos = torch.full((s, q_len), -1, dtype=torch.long)  # -1: padding
    k_pos = torch.full((s, k_len), _NEVER, dtype=torch.long)
    for i, (q, qp, k, kp) in enumerate(parts):
        query[i, : len(q)], q_pos[i, : len(qp)] = torch.tensor(q), torch.tensor(qp)
        key[i, : len(k)], k_pos[i, : len(kp)] = torch.tensor(k), torch.tensor(kp)
    mask = k_pos[:, None, :] <= q_pos[:, :, None]  # (S, Q, K)
    mask[:, :, 0] |= q_pos < 0  # a padded query reads key 0: no all-masked row (its softmax would be NaN)
    real = (q_pos >= 0).flatten().nonzero().squeeze(1)  # (R,)
    return Segments(query.to(device), key.to(device), mask[:, None].to(device)), real.to(device)


def packed_attention(q: Tensor, k: Tensor, v: Tensor, packing: Packing) -> Tensor:
    """q (1, Hq, N, D), k, v (1, Hkv, N, D) of a packed sequence -> (1, Hq, N, D): each segment's queries over
    its keys (scaled dot product, query head j reading KV head j // (Hq / Hkv))."""
    if q.shape[0] != 1 or q.shape[2] != packing.ids.shape[1]:
        raise BebopError(f"packed attention: q {tuple(q.shape)} is not one row of the packing's "
                         f"{packing.ids.shape[1]} tokens")
    flat = [x[0].transpose(0, 1) for x in (q, k, v)]  # (N, heads, D) each
    outs = []
    for seg in packing.segments:
        qs, ks, vs = (x.index_select(0, idx.flatten()).unflatten(0, idx.shape).transpose(1, 2)  # (S, heads, Q|K, D)
                      for x, idx in zip(flat, (seg.query, seg.key, seg.key), strict=True))
        out = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=seg.mask, enable_gqa=True)  # (S, Hq, Q, D)
        outs.append(out.transpose(1, 2).flatten(0, 1))  # (S * Q, Hq, D)
    return torch.cat(outs).index_select(0, packing.places).transpose(0, 1)[None]  # (1, Hq, N, D)
