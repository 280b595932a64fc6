"""Per-row bookkeeping shared by every decoding loop (plain and speculative).

A `RowBook` takes the tokens a step emitted for each row and applies the rules: truncate at a
stop token or at `max_new_tokens`, hand control to the environment on an interrupt token (the
agent task's `</call>`), and say what each row must feed to the model next.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bebop.engine.records import FINISH_LENGTH, FINISH_STOP, Generation

# observer(row, token_ids_so_far) -> observation token ids to prefill, or None (no environment)
Observer = Callable[[int, list[int]], "list[int] | None"]


class RowBook:
    def __init__(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, stop_ids: Sequence[int],
                 interrupt_ids: Sequence[int] = (), observer: Observer | None = None) -> None:
        self.rows = [Generation(prompt_ids=list(p)) for p in prompts]
        self.max_new_tokens = max_new_tokens
        self.stop_ids = frozenset(stop_ids)
        self.interrupt_ids = frozenset(interrupt_ids) if observer else frozenset()
        self.observer = observer
        self.pending: list[list[int]] = [list(p) for p in prompts]  # tokens to feed next step
        if max_new_tokens <= 0:
            for row in self.rows:
                row.finish_reason = FINISH_LENGTH

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
            elif len(row.token_ids) >= self.max_new_tokens:
                row.finish_reason = FINISH_LENGTH
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
        room = self.max_new_tokens - len(row.token_ids)
        for tok in observation[:room]:
            self._append(row, tok, 0.0, 0.0, False)
        self.pending[b].extend(observation[:room])
        if len(observation) >= room:
            row.finish_reason = FINISH_LENGTH
            self.pending[b] = []

    @staticmethod
    def _append(row: Generation, tok: int, lp: float, ent: float, is_policy: bool) -> None:
        row.token_ids.append(tok)
        row.logprobs.append(lp)
        row.entropies.append(ent)
        row.policy_mask.append(is_policy)
