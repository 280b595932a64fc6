"""A suffix index of the rollouts' own text, for drafting without a model: each row's prompt and response so far,
its group's siblings (rows with the same prompt, GRPO's group), and the earlier responses to the same prompt that
the index has seen (it outlives a call: RL steps and epochs). For a row it proposes the continuation that followed
the longest match of the row's last tokens (prompt-lookup decoding; Seer's group drafts; HistoSpec's history).

    index = SuffixIndex()
    doc = index.open(prompt_ids)             # a row: its prompt, indexed once per distinct prompt
    index.extend(doc, new_tokens)            # as the row emits
    tokens, match, seen = index.propose(doc, k)   # up to k tokens; the match's length and how often it occurred
    index.close_call()                       # the call's rows become history (bounded: below)

Structure: per distinct prompt (a group), a hash table from every n-gram of its documents (n in MATCH_LENGTHS,
those with a next token) to its latest occurrence and its count. A lookup is at most len(MATCH_LENGTHS) dictionary
probes and an emitted token as many inserts: microseconds per row, independent of how much text the group holds (a
suffix automaton answers unbounded matches in the same time; a match longer than 8 tokens adds little a draft of
at most 8 tokens can use, and lengths between the ones indexed are found at the next shorter one). An n-gram maps
to its latest occurrence: a sibling's newest text, a row's own repetition, or the prompt.

Memory: at most `max_docs` documents per group (the oldest finished responses dropped first; table entries that
point to a dropped one are removed when a lookup meets them) and `max_groups` groups (the least recently opened
dropped whole): at most max_groups x max_docs responses of text and len(lengths) table entries per token of it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

MATCH_LENGTHS = (1, 2, 4, 8)  # the n-grams indexed (tokens): a match is the longest of these that occurred


@dataclass
class _Doc:
    group: _Group
    tokens: list[int]
    indexed: int  # n-grams ending before this position are in the table (with their next token)


@dataclass
class _Group:
    table: dict[tuple[int, ...], tuple[int, int, int]] = field(default_factory=dict)  # n-gram -> (doc, end, count)
    docs: OrderedDict[int, list[int]] = field(default_factory=OrderedDict)  # doc id -> tokens, oldest first
    prompt_id: int = -1  # the document that is the prompt itself (kept while the group is)


class SuffixIndex:
    def __init__(self, lengths: tuple[int, ...] = MATCH_LENGTHS, max_docs: int = 64, max_groups: int = 1024) -> None:
        if not (lengths and min(lengths) >= 1 and max_docs >= 2 and max_groups >= 1):
            raise ValueError("need n-gram lengths >= 1, max_docs >= 2 and max_groups >= 1")
        self.lengths, self.max_docs, self.max_groups = tuple(sorted(set(lengths))), max_docs, max_groups
        self._groups: OrderedDict[tuple[int, ...], _Group] = OrderedDict()
        self._open: dict[int, _Doc] = {}  # this call's rows
        self._next_id = 0

    def open(self, prompt: Sequence[int]) -> int:
        """A new row with this prompt -> its document id. The prompt's n-grams are indexed with the group's first
        row; a row's own document starts past them."""
        key = tuple(prompt)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group()
            group.prompt_id = self._add(group, list(prompt), 0)  # the prompt itself, a document of the group
            while len(self._groups) > self.max_groups:
                self._groups.popitem(last=False)
        self._groups.move_to_end(key)
        doc_id = self._add(group, list(prompt), max(0, len(prompt) - 1))
        self._open[doc_id] = _Doc(group, group.docs[doc_id], max(0, len(prompt) - 1))
        return doc_id

    def _add(self, group: _Group, tokens: list[int], indexed_from: int) -> int:
        doc_id, self._next_id = self._next_id, self._next_id + 1
        group.docs[doc_id] = tokens
        self._index(group, doc_id, tokens, indexed_from)
        return doc_id

    def _index(self, group: _Group, doc_id: int, tokens: list[int], start: int) -> int:
        """Index the n-grams ending at start .. len - 2 (each has a next token) -> the new indexed bound."""
        table, lengths, get = group.table, self.lengths, group.table.get
        for end in range(start, len(tokens) - 1):
            for n in lengths:
                if n > end + 1:
                    break
                key = tuple(tokens[end - n + 1:end + 1])
                old = get(key)
                table[key] = (doc_id, end, old[2] + 1 if old else 1)
        return max(start, len(tokens) - 1)

    def extend(self, doc_id: int, tokens: Sequence[int]) -> None:
        """Append a row's new tokens (emitted, or an observation the environment added)."""
        if not tokens:
            return
        doc = self._open[doc_id]
        doc.tokens.extend(tokens)
        doc.indexed = self._index(doc.group, doc_id, doc.tokens, doc.indexed)

    def propose(self, doc_id: int, k: int) -> tuple[list[int], int, int]:
        """Up to k tokens that followed the longest indexed match of the row's last tokens -> (tokens, the match's
        length, how often that n-gram occurred); ([], 0, 0) when nothing matches."""
        doc = self._open[doc_id]
        tokens, table, docs = doc.tokens, doc.group.table, doc.group.docs
        for n in reversed(self.lengths):
            if n > len(tokens):
                continue
            key = tuple(tokens[len(tokens) - n:])
            entry = table.get(key)
            if entry is None:
                continue
            source = docs.get(entry[0])
            if source is None:  # a dropped document's
                del table[key]
                continue
            follow = source[entry[1] + 1:entry[1] + 1 + k]
            if follow:
                return follow, n, entry[2]
        return [], 0, 0

    def close_call(self) -> None:
        """The call's rows become history: each group keeps its prompt and its newest max_docs - 1 responses; a
        table grown past twice what its documents index is rebuilt from them."""
        self._open.clear()
        for group in self._groups.values():
            dropped = [d for d in group.docs if d != group.prompt_id][:max(0, len(group.docs) - self.max_docs)]
            for doc_id in dropped:
                del group.docs[doc_id]
            if len(group.table) > 2 * len(self.lengths) * sum(len(t) for t in group.docs.values()):
                group.table.clear()
                for doc_id, tokens in group.docs.items():
                    self._index(group, doc_id, tokens, 0)

    def __len__(self) -> int:
        """Documents held (prompts, rows and history)."""
        return sum(len(g.docs) for g in self._groups.values())
