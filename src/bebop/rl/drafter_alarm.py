"""The drafter alarm: a draft head whose acceptance collapses must not go unnoticed.

Users of other RL stacks report heads lost or left stale by a weight sync (SGLang #31674: the
acceptance length fell to about 1.0 and rollouts ran 25% slower with nobody told). bebop watches
the head's first-draft acceptance (the share of verifications whose first draft was accepted),
step by step. Not the mean acceptance length itself: with --k auto it moves with the k each step
chose (deep drafts in the tail, none at large batches) even when the head is fine, while the
first draft is verified at every k; a lost head takes both to about zero gain together.

    alarm = DrafterAlarm()
    change = alarm.observe(batch.spec)   # after each RL step: "raised", "cleared" or None

- the baseline is the mean first-draft acceptance of the first BASELINE_STEPS steps that drafted;
- the alarm is raised when it stays below FRACTION x baseline for PATIENCE drafting steps in a row,
  and cleared at the first drafting step back above that line;
- a step that verified no drafts (spec off, or --k auto choosing plain steps only) is no evidence
  either way and changes nothing.

The defaults are loose on purpose: under RL the policy's entropy rises and acceptance drifts down
with it (the paper's entropy law, docs/method.md section 5) by far less than half; a lost or stale head
falls to near 0. The loop prints one warning line when the alarm is raised, writes
`drafter_alarm: true` in every step's metrics while it is up, and with --k auto stops drafting
(AdaptiveK.suspended: plain steps, with a drafting probe every PROBE_EVERY engine steps so that
recovery can be seen) until it clears. With a fixed K it only warns: the user chose that K.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from bebop.engine.metrics import SpecMetrics

BASELINE_STEPS = 3  # drafting steps whose mean first-draft acceptance is the baseline
FRACTION = 0.5  # the alarm line: this share of the baseline
PATIENCE = 3  # drafting steps in a row below the line before the alarm is raised
RAISED, CLEARED = "raised", "cleared"


@dataclass
class DrafterAlarm:
    baseline_steps: int = BASELINE_STEPS
    fraction: float = FRACTION
    patience: int = PATIENCE
    rates: list[float] = field(default_factory=list)  # the first drafting steps' first-draft acceptance
    low_streak: int = 0
    raised: bool = False

    @property
    def baseline(self) -> float | None:
        """Mean first-draft acceptance of the first drafting steps, once there are baseline_steps."""
        return sum(self.rates) / len(self.rates) if len(self.rates) >= self.baseline_steps else None

    def observe(self, spec: SpecMetrics | None) -> str | None:
        """One RL step's acceptance metrics -> RAISED or CLEARED when the alarm changes, else None."""
        if spec is None or not spec.num_drafts:
            return None
        rate = spec.acceptance_rate_per_position[0]
        if self.baseline is None:
            self.rates.append(rate)
            return None
        low = rate < self.fraction * self.baseline
        self.low_streak = self.low_streak + 1 if low else 0
        if not self.raised and self.low_streak >= self.patience:
            self.raised = True
            return RAISED
        if self.raised and not low:
            self.raised = False
            return CLEARED
        return None

    def message(self, spec: SpecMetrics) -> str:
        return (f"bebop: drafter alarm: first-draft acceptance {spec.acceptance_rate_per_position[0]:.2f} (mean "
                f"acceptance length {spec.mean_acceptance_length:.2f}) has stayed below {self.fraction:g} x its "
                f"baseline {self.baseline:.2f} for {self.patience} steps: is the draft head lost or stale after a "
                f"weight sync? With --k auto drafting stops until acceptance recovers.")

    def state(self) -> dict:
        return asdict(self)
