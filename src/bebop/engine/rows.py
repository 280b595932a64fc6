"""Per-row bookkeeping shared by every decoding loop (plain and speculative).

A `RowBook` takes the tokens a step emitted for each row and applies the rules: truncate at a
stop token, at `max_new_tokens` or where the model's context ends (each row's own room: `room`), hand
control to the environment on an interrupt token (the agent task's `</call>`), and say what each row
must feed to the model next.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bebop.engine.records import FINISH_CONTEXT, FINISH_LENGTH, FINISH_STOP, Generation

# observer(row, token_ids_so_far) -> observation token ids to prefill, or None (no environment)
Observer = Callable[[int, list[int]], "list[int] | None"]


def room(prompt_len: int, max_new_tokens: int, context: int | None) -> int:
    """The new tokens a row may hold: max_new_tokens, or fewer where the model's context ends first."""
    return max_new_tokens if context is None else min(max_new_tokens, context - prompt_len)


class RowBook:
    def __init__(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, stop_ids: Sequence[int],
                 interrupt_ids: Sequence[int] = (), observer: Observer | None = None, *,
                 context: int | None = None) -> None:
        self.rows = [Generation(prompt_ids=list(p)) for p in prompts]
        self.max_new_tokens = max_new_tokens
        self.limits = [room(len(p), max_new_tokens, context) for p in prompts]  # each row's own
        self.stop_ids = frozenset(stop_ids)
        self.interrupt_ids = frozenset(interrupt_ids) if observer else frozenset()
        self.observer = observer
        self.pending: list[list[int]] = [list(p) for p in prompts]  # tokens to feed next step
        for b, row in enumerate(self.rows):
            if self.limits[b] <= 0:
                row.finish_reason = self._cut(b)

    def room_left(self, b: int) -> int:
        return self.limits[b] - len(self.rows[b].token_ids)

    def _cut(self, b: int) -> str:
        """Why row b stops at its limit: max_new_tokens, or the context ending first."""
        return FINISH_LENGTH if self.limits[b] >= self.max_new_tokens else FINISH_CONTEXT

    @property
    def all_done(self) -> bool:
        return all(row.done for row in self.rows)

    def emit(self, b: int, tokens: Sequence[int], logprobs: Sequence[float], entropies: Sequence[float]) -> int:
        """Record a step's tokens for row b; return how many were kept (<= len(tokens)). A row already
        done (riding along until the batch compacts) keeps nothing and counts no forward.

        Sets the row's next input: the last kept token, plus any observation it triggered."""
        row = self.rows[b]
        if row.done:
            return 0
        row.forwards += 1
        kept = 0
        for tok, lp, ent in zip(tokens, logprobs, entropies):
            if row.done:
                break
            self._append(row, tok, lp, ent, True)
            kept += 1
            if tok in self.stop_ids:
                row.finish_reason = FINISH_STOP
            elif len(row.token_ids) >= self.limits[b]:
                row.finish_reason = self._cut(b)
            elif tok in self.interrupt_ids:
                break  # the environment answers before the policy goes on
        self.pending[b] = [] if row.done else [row.token_ids[-1]]
        if not row.done and row.token_ids[-1] in self.interrupt_ids:
            self._observe(b)
        return kept

    def _observe(self, b: int) -> None:
        row = self.rows[b]
        assert self.observer is not None  # interrupt_ids is empty without an observer
        observation = self.observer(b, list(row.token_ids)) or []
        left = self.room_left(b)
        for tok in observation[:left]:
            self._append(row, tok, 0.0, 0.0, False)
        self.pending[b].extend(observation[:left])
        if len(observation) >= left:
            row.finish_reason = self._cut(b)
            self.pending[b] = []

    @staticmethod
    def _append(row: Generation, tok: int, lp: float, ent: float, is_policy: bool) -> None:
        row.token_ids.append(tok)
        row.logprobs.append(lp)
        row.entropies.append(ent)
        row.policy_mask.append(is_policy)
