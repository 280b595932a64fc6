"""Speculative-decoding metrics with vLLM's names and definitions.

    num_drafts                  verification steps that carried drafts (one per row per step)
    num_draft_tokens            drafted tokens (k per draft; k varies per step with --k auto)
    num_accepted_tokens         drafts accepted by the acceptance rule
    acceptance_rate             num_accepted_tokens / num_draft_tokens
    mean_acceptance_length      1 + num_accepted_tokens / num_drafts  (tokens per target forward, max K+1)
    acceptance_rate_per_position[d-1]   drafts accepted at depth d / num_drafts
    mean_entropy                mean target entropy of the emitted policy tokens (nats)
    k_histogram                 {live-batch range: {k: steps}}: how many drafts each step verified,
                                by the number of rows still generating ('1', '2-3', '4-7', ...)
    draft_log                   with log_drafts=True (evaluation): one (depth, target entropy, accepted,
                                sequence) per verified draft, the per-token data of the entropy law
                                (bebop.stats.entropy_bins); sequence: the prompt's index in its call,
                                renumbered by merge so that two calls' sequences stay apart; not in to_dict
    by_source                   {drafter: {num_drafts, mean_acceptance_length}}: "mtp" (the head), "suffix" (the
                                rollouts' own text; engine/suffix_drafter.py)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field


def rows_bucket(rows: int) -> int:
    """Octave buckets of the live-row count: 0 for 1 row, 1 for 2-3, 2 for 4-7, ..."""
    return max(1, rows).bit_length() - 1


def size_label(rows: int) -> str:
    """The octave's range as text: '1', '2-3', '4-7', ..."""
    lo = 1 << rows_bucket(rows)
    return str(lo) if lo == 1 else f"{lo}-{2 * lo - 1}"


@dataclass
class SpecMetrics:
    k: int  # the largest K a step may verify (fixed K, or --max-k with --k auto)
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    entropy_sum: float = 0.0
    num_emitted: int = 0
    k_histogram: dict[str, Counter] = field(default_factory=dict)
    draft_log: list[tuple[int, float, bool, int]] | None = None  # (depth, H(p_depth) nats, accepted, sequence)
    by_source: dict[str, list[int]] = field(default_factory=dict)  # drafter -> [drafts, accepted tokens]

    def __post_init__(self) -> None:
        self.accepted_per_position = (list(self.accepted_per_position) + [0] * self.k)[: self.k]

    def record_draft(self, num_accepted: int, k: int | None = None, entropies: Sequence[float] = (),
                     sequence: int = 0, source: str = "mtp") -> None:
        """One verified chain of k drafts of which the first num_accepted were kept; `entropies`: the
        target's entropy at depths 1, 2, ... (only read with a draft log, for the depths the
        verification reached: 1 .. min(k, num_accepted + 1)); `sequence`: the row it was drafted in; `source`: what
        drafted it (the head, "mtp", or the rollouts' text, "suffix")."""
        k = self.k if k is None else k
        count_draft(self.by_source, source, num_accepted)
        if self.draft_log is not None:
            reached = entropies[: min(k, num_accepted + 1)]
            self.draft_log += [(d + 1, h, d < num_accepted, sequence) for d, h in enumerate(reached)]
        self.num_drafts += 1
        self.num_draft_tokens += k
        self.num_accepted_tokens += num_accepted
        for d in range(num_accepted):
            self.accepted_per_position[d] += 1

    def record_step(self, rows: int, k: int) -> None:
        label = size_label(rows)
        if label not in self.k_histogram:
            self.k_histogram[label] = Counter()
        self.k_histogram[label][k] += 1

    def record_emitted(self, entropies: list[float]) -> None:
        self.entropy_sum += sum(entropies)
        self.num_emitted += len(entropies)

    def merge(self, other: "SpecMetrics") -> "SpecMetrics":
        k = max(self.k, other.k)
        pad = lambda xs: list(xs) + [0] * (k - len(xs))  # noqa: E731
        histogram = {label: Counter(self.k_histogram.get(label, {})) + Counter(other.k_histogram.get(label, {}))
                     for label in {*self.k_histogram, *other.k_histogram}}
        log = None if self.draft_log is None or other.draft_log is None else \
            self.draft_log + _apart(other.draft_log, self.draft_log)
        sources = {s: [a + b for a, b in zip(self.by_source.get(s, [0, 0]), other.by_source.get(s, [0, 0]))]
                   for s in {*self.by_source, *other.by_source}}
        return SpecMetrics(k, self.num_drafts + other.num_drafts, self.num_draft_tokens + other.num_draft_tokens,
                           self.num_accepted_tokens + other.num_accepted_tokens,
                           [a + b for a, b in zip(pad(self.accepted_per_position), pad(other.accepted_per_position))],
                           self.entropy_sum + other.entropy_sum, self.num_emitted + other.num_emitted, histogram, log,
                           sources)

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        return [a / self.num_drafts if self.num_drafts else 0.0 for a in self.accepted_per_position]

    @property
    def mean_entropy(self) -> float:
        return self.entropy_sum / self.num_emitted if self.num_emitted else 0.0

    def to_dict(self) -> dict:
        return {"k": self.k, "num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
                "num_accepted_tokens": self.num_accepted_tokens, "acceptance_rate": self.acceptance_rate,
                "mean_acceptance_length": self.mean_acceptance_length,
                "acceptance_rate_per_position": self.acceptance_rate_per_position, "mean_entropy": self.mean_entropy,
                "k_histogram": {label: {str(k): n for k, n in sorted(c.items())}
                                for label, c in sorted(self.k_histogram.items(), key=lambda kv: int(kv[0].split("-")[0]))},
                "by_source": {s: {"num_drafts": n, "mean_acceptance_length": 1 + a / n if n else 1.0}
                              for s, (n, a) in sorted(self.by_source.items())}}


def count_draft(by_source: dict[str, list[int]], source: str, num_accepted: int) -> None:
    """One verified draft from `source` with num_accepted tokens kept, into {source: [drafts, accepted tokens]}."""
    counts = by_source.setdefault(source, [0, 0])
    counts[0], counts[1] = counts[0] + 1, counts[1] + num_accepted


def _apart(log: list, after: list) -> list:
    """`log`'s records with their sequence ids moved past every id of `after`."""
    offset = 1 + max((record[3] for record in after), default=-1)
    return [(d, h, a, s + offset) for d, h, a, s in log]


def merged(metrics: Sequence[SpecMetrics], k: int) -> SpecMetrics:
    """The metrics of several generate calls as one (k: the largest K any of them may verify)."""
    out = SpecMetrics(k, draft_log=[] if any(m.draft_log is not None for m in metrics) else None)
    for m in metrics:
        out = out.merge(m)
    return out
