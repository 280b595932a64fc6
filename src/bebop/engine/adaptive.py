"""Adaptive speculation (`--k auto`): each step verifies the number of drafts that maximises the
expected emitted tokens per second, 0 meaning a plain step.

    policy = AdaptiveK(max_k=6, costs=step_costs(model, max_rows=64, max_k=6))
    k = policy.choose(rows)                  # before the step
    policy.observe(rows, k, seconds, accepted)  # after it: measured time, accepted drafts per row

Expected tokens of a step with k drafts: E(k) = 1 + sum_{j<=k} prod_{i<=j} alpha_i (docs/method.md
section 3), with alpha_d the running conditional acceptance at depth d (accepted at d / reached d,
decayed so it follows a policy that changes under RL; an unseen depth borrows the depth before it).
Cost: `StepCosts.predict(rows, k)`. The choice is argmax_k E(k) / cost(rows, k). So a large live
batch, where a verify over k + 1 tokens per row is compute-bound, falls back to plain steps, and
a small one drafts deep. The kind of step (plain / drafting) the estimates do not choose is measured
first (drafting also when the costs are cached from an earlier call but this controller has verified no
draft: the acceptance is the prior until then), a drafting probe with PROBE_K drafts (the cheapest
drafting step: it measures the level every k shares); a live-batch bucket (octaves: 1, 2-3, 4-7, ...)
starts from its nearest measured neighbour and measures the kind it is not choosing again every
PROBE_EVERY steps, so neither a profile that is off nor one slow step can lock it out of the better
kind. Where drafting is predicted far from winning (its throughput below PROBE_BAND of the margin it
must beat: a large live batch on a CPU, where a verify is compute-bound; judged on a measurement of
drafting at that size, or on the profile before any) it is probed only every FAR_PROBE_EVERY steps, the
first time included: a drafting probe is the costly kind (a verify over k + 1 tokens a row, the catch-up
refresh over every skipped position, rows that desynchronise), so there `--k auto` runs as plain
decoding does, and a long run (an RL run keeps its controller) still sees a measurement that was off.
Only decode steps are measured (every row feeds one token, no catch-up refresh): a prefill, an
observation or a refresh over skipped steps would charge its cost to the k of that step. The decoding
loop counts every decision per live-batch size (SpecMetrics.k_histogram).

Anchors: vLLM's adaptive verification (costs profiled at start-up, survival probability per
draft slot), SGLang's per-batch-size step tiers, TensorRT-LLM's `draft_len_schedule`.
"""

from __future__ import annotations

from bebop.engine.metrics import rows_bucket
from bebop.engine.step_costs import StepCosts

PRIOR_ACCEPTANCE = 0.7  # alpha before any draft was verified
PRIOR_WEIGHT = 2.0  # in drafts
DECAY = 0.9  # per step: acceptance follows about the last 10 steps
# drafting must beat plain steps by this factor per step: a speculative batch desynchronises (rows
# accept different numbers of drafts, so the slowest row gates the batch's end and the tail runs at a
# small live batch) and resuming drafting pays a catch-up refresh; neither is in the per-step model
# (docs/benchmarks.md: measured below plain where its steps were predicted above).
DRAFT_MARGIN = 1.15
PROBE_EVERY = 32  # measured steps after which the kind (plain / drafting) not chosen is measured again
# drafting is measured (first, or again) only where its predicted throughput is at least this share of
# DRAFT_MARGIN x plain's: within the error of a profile, not where it would take the estimate's level to
# be off by more than 1 / PROBE_BAND
PROBE_BAND = 0.75
FAR_PROBE_EVERY = 8 * PROBE_EVERY  # measured steps between probes of drafting predicted outside the band
FAR_AFTER = 2  # own drafting steps measured in a bucket before its probes are spaced out (even the best of them far)
# drafts of a drafting probe: the cheapest drafting step measures the level every k shares (the profile gives
# the shape in k) and desynchronises the batch least
PROBE_K = 1


class AcceptanceEstimate:
    """Running conditional acceptance per depth, from the accepted-draft count of each verified row."""

    def __init__(self, max_k: int) -> None:
        self.reached = [0.0] * max_k  # decayed count of drafts verified at depth d (d-1 accepted)
        self.accepted = [0.0] * max_k  # ... of which accepted

    @classmethod
    def constant(cls, rates: list[float]) -> AcceptanceEstimate:
        """An estimate fixed at these conditional rates per depth (what-if studies: benchmarks)."""
        est = cls(len(rates))
        est.reached = [1e9] * len(rates)  # the prior weighs nothing against this evidence
        est.accepted = [1e9 * a for a in rates]
        return est

    def observe(self, k: int, accepted: list[int]) -> None:
        self.reached = [r * DECAY for r in self.reached]
        self.accepted = [a * DECAY for a in self.accepted]
        for n in accepted:
            for d in range(min(k, n + 1)):
                self.reached[d] += 1
                self.accepted[d] += d < n

    def seen(self) -> bool:
        """Whether any draft was verified (else every rate is the prior)."""
        return any(self.reached)

    def rates(self) -> list[float]:
        out, prior = [], PRIOR_ACCEPTANCE
        for reached, accepted in zip(self.reached, self.accepted):
            prior = (accepted + PRIOR_WEIGHT * prior) / (reached + PRIOR_WEIGHT)
            out.append(prior)
        return out

    def expected_tokens(self, k: int) -> float:
        total, survive = 1.0, 1.0
        for alpha in self.rates()[:k]:
            survive *= alpha
            total += survive
        return total


class AdaptiveK:
    def __init__(self, max_k: int, costs: StepCosts, refine: bool = True) -> None:
        self.max_k = max_k
        self.costs = costs
        self.refine = refine  # measured steps correct the costs; else the table alone prices a step (reproducible)
        self.acceptance = AcceptanceEstimate(max_k)
        self.steps = 0  # measured steps
        self.last_measured: dict[tuple[int, bool], int] = {}  # (rows bucket, drafting) -> step index
        self.suspended = False  # set by the RL drafter alarm: plain steps, a drafting probe every PROBE_EVERY

    def throughput(self, rows: int, k: int, lowest: bool = False) -> float:
        """Predicted emitted tokens per second per row (`lowest`: StepCosts.predict's best case)."""
        return self.acceptance.expected_tokens(k) / self.costs.predict(rows, k, lowest)

    def best_draft(self, rows: int) -> int:
        """The k >= 1 of highest predicted throughput at `rows` live rows."""
        return max(range(1, self.max_k + 1), key=lambda k: self.throughput(rows, k))

    def drafting_edge(self, rows: int, k: int, lowest: bool = False) -> float:
        """Predicted throughput of drafting k over DRAFT_MARGIN x plain's: drafting is chosen above 1. `lowest`:
        drafting at the best its own steps here showed."""
        return self.throughput(rows, k, lowest) / (DRAFT_MARGIN * self.throughput(rows, 0))

    def best(self, rows: int) -> int:
        """The rule on its estimates alone: the best k, or 0 unless drafting beats plain steps by DRAFT_MARGIN."""
        k = self.best_draft(rows)
        return k if self.drafting_edge(rows, k) > 1 else 0

    def choose(self, rows: int) -> int:
        """`best`, with the kind it does not choose (plain / drafting) measured once and re-probed every
        PROBE_EVERY steps in a bucket (so the cost ratios stay current; drafting predicted outside PROBE_BAND
        every FAR_PROBE_EVERY), a drafting probe at PROBE_K drafts; only probes while suspended."""
        bucket = rows_bucket(rows)
        best_draft = self.best_draft(rows)
        if self.suspended:  # drafting only often enough to see the head recover
            last = self.last_measured.setdefault((bucket, True), self.steps)
            return best_draft if self.steps - last > PROBE_EVERY else 0
        choice = self.best(rows)
        for drafting, k in ((False, 0), (True, min(best_draft, PROBE_K))):
            if drafting == (choice > 0):
                continue  # the kind chosen is measured by its own steps
            # a probe would cost more than it can find: drafting predicted far below the margin even at the best
            # of FAR_AFTER own measurements of drafting in this very bucket (one slow step on a shared machine
            # does not stop probes), or, before any level is known, on the profile alone; not on a level borrowed
            # from another live-batch size nor one read from a table (a new process measures its own)
            far = drafting and (
                (self.costs.measured_here(bucket, True, FAR_AFTER) and self.drafting_edge(rows, best_draft, True)
                 < PROBE_BAND)
                or (not self.costs.has_level(True) and self.drafting_edge(rows, best_draft) < PROBE_BAND))
            unknown = not self.costs.has_measured(drafting) or (drafting and not self.acceptance.seen())
            if not far and unknown:  # a new controller over cached costs has not verified a draft: measure it first
                return k
            last = self.last_measured.setdefault((bucket, drafting), self.steps)  # a new bucket borrows
            if self.steps - last > (FAR_PROBE_EVERY if far else PROBE_EVERY):
                return k
        return choice

    def observe(self, rows: int, k: int, seconds: float, accepted: list[int]) -> None:
        """After a decode step over `rows` live rows with k drafts: its wall time and each drafting
        row's accepted-draft count (empty when no row drafted)."""
        self.costs.observe(rows, k, seconds if self.refine else None)  # not refining: the table alone prices steps
        self.last_measured[(rows_bucket(rows), k > 0)] = self.steps
        self.steps += 1
        if k and accepted:
            self.acceptance.observe(k, accepted)
