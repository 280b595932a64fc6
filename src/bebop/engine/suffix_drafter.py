"""Drafts from the rollouts' own text (engine/suffix_index.py) for the speculative engine: a row's draft is the
continuation its index proposes, as point masses q_d = 1 on y_d. Rejection sampling then accepts y_d with
probability min(1, p(y_d) / 1) = p(y_d) and on a rejection resamples from norm(max(p - q, 0)), which is p without
y_d: every emitted token is distributed exactly as the policy's own (docs/method.md), whatever the index proposes,
a token the warped target gives no mass included (it is rejected with probability 1). Target-only acceptance takes
the target's own sample and compares it with y_d: lossless for any draft. No model runs to draft.

    drafter = SuffixDrafter(index, book)          # the call's rows opened in the index
    drafter.sync(live)                            # their tokens emitted since, into the index
    proposals = drafter.propose(live, k)          # per row: up to k tokens ([] where nothing matches)
    drafts, draft_probs = point_mass_drafts(proposals, k, vocab, device)    # (R, k), (R, k, V)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from bebop.engine.rows import RowBook
from bebop.engine.suffix_index import SuffixIndex

DRAFTERS = ("mtp", "suffix", "both")  # the model's MTP head, the rollouts' own text, or per row the better
MIN_MATCH = {"suffix": 1, "both": 4}  # the shortest match whose continuation drafts (with both: instead of the head)


class SuffixDrafter:
    """The rows of one generate call in a suffix index (which outlives the call: its rows become history)."""

    def __init__(self, index: SuffixIndex, book: RowBook, min_match: int = 1) -> None:
        self.index, self.book, self.min_match = index, book, min_match
        self.docs = [index.open(row.prompt_ids) for row in book.rows]
        self.seen = [0] * len(book.rows)  # each row's output tokens already in the index

    def sync(self, rows: Sequence[int]) -> None:
        """Every token the rows emitted (or were fed as an observation) since the last sync, into the index."""
        for row in rows:
            tokens = self.book.rows[row].token_ids
            if len(tokens) > self.seen[row]:
                self.index.extend(self.docs[row], tokens[self.seen[row]:])
                self.seen[row] = len(tokens)

    def propose(self, rows: Sequence[int], k: int) -> list[tuple[list[int], int]]:
        """Per row, up to k tokens to follow its text and the match's length (([], 0) where no match of min_match
        tokens or more)."""
        out = []
        for row in rows:
            tokens, match, _ = self.index.propose(self.docs[row], k)
            out.append((tokens, match) if match >= self.min_match else ([], 0))
        return out

    def close(self) -> None:
        self.index.close_call()


class SourceChooser:
    """Per match length, what the rollouts' text has paid when it drafted: the running mean of the tokens accepted
    from a continuation and the share of its tokens accepted. With both drafters a row drafts its continuation where
    that mean is at least the head's (a match length not yet tried is tried); with either, a match whose share is
    at least STRONG_SHARE is strong, and a strong match may draft past K (`deepen`). Only finished steps feed it,
    so a row's source and its draft's length depend on the past alone (lossless)."""

    DECAY = 0.95  # per observation: the estimates follow a policy that changes under RL
    STRONG_SHARE = 0.8  # of a continuation's tokens accepted, on average
    STRONG_AFTER = 4  # continuations verified at a match length before it can be strong

    def __init__(self) -> None:
        self.head: float | None = None  # tokens accepted per head draft
        self.suffix: dict[int, float] = {}  # match length -> tokens accepted per continuation draft
        self.share: dict[int, float] = {}  # match length -> share of a continuation's drafted tokens accepted
        self.seen: dict[int, int] = {}  # match length -> continuations verified

    def prefer_suffix(self, match: int) -> bool:
        mean = self.suffix.get(match)
        return mean is None or self.head is None or mean >= self.head

    def strong(self, match: int) -> bool:
        return self.seen.get(match, 0) >= self.STRONG_AFTER and self.share[match] >= self.STRONG_SHARE

    def observe(self, match: int, accepted: int, drafted: int = 1) -> None:
        """A verified draft: from the head (match 0) or from a continuation of `drafted` tokens after a match of
        `match` tokens, of which `accepted` were accepted."""
        if match == 0:
            self.head = _decayed(self.head, accepted, self.DECAY)
            return
        self.suffix[match] = _decayed(self.suffix.get(match), accepted, self.DECAY)
        self.share[match] = _decayed(self.share.get(match), min(accepted, drafted) / max(drafted, 1), self.DECAY)
        self.seen[match] = self.seen.get(match, 0) + 1

    def deepen(self, k: int, found: Sequence[tuple[Sequence[int], int]], max_k: int, worth) -> int:
        """The step's k: `k` (K, or the controller's choice), or deeper, up to max_k and the longest strong
        continuation, where `worth(deep, gain, rows)` says the gain pays: gain = the tokens the `rows` strong rows'
        continuations are expected to add past k (their share x the extra drafts)."""
        if not k or k >= max_k:
            return k
        strong = [(len(p), self.share.get(n, 0.0)) for p, n in found if len(p) > k and self.strong(n)]
        if not strong:
            return k
        deep = min(max_k, max(n for n, _ in strong))
        gain = sum(share * (min(n, deep) - k) for n, share in strong)
        return deep if worth(deep, gain, len(strong)) else k


def _decayed(mean: float | None, value: float, decay: float) -> float:
    return value if mean is None else decay * mean + (1 - decay) * value


def index_for(drafter: str, index: SuffixIndex | None) -> SuffixIndex | None:
    """The index a drafter drafts from: `index`, or a new one; None for the head alone."""
    if drafter == "mtp":
        return None
    return SuffixIndex() if index is None else index


def point_mass_drafts(proposals: Sequence[Sequence[int]], k: int, vocab: int,
                      device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """-> drafts (R, k), each proposal padded to k with its last token (a row without one: token 0; it does not
    draft), and draft_probs (R, k, V): one-hot on each draft."""
    rows = [list(p[:k]) + [p[-1] if p else 0] * (k - len(p[:k])) for p in proposals]
    drafts = torch.tensor(rows, dtype=torch.long, device=device).reshape(len(rows), k)  # (R, k)
    return drafts, torch.nn.functional.one_hot(drafts, vocab).to(torch.float32)  # (R, k, V)
