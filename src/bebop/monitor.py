"""Acceptance tracking and the drafter alarm for another engine's rollouts, from its own counters.

    monitor = EngineMonitor()
    for step in range(steps):                       # in a verl / TRL callback after each rollout
        row = monitor.observe(vllm_counters())      # the engine's cumulative counters, vLLM's names
        if row["alarm_change"] == "raised": ...     # the head's first-draft acceptance collapsed

`observe` takes the cumulative counters an engine exports (vLLM: spec_decode_num_drafts,
spec_decode_num_draft_tokens, spec_decode_num_accepted_tokens_per_pos, with or without the "vllm:"
prefix, as a dict) and turns the change since the last call into one step's acceptance metrics, vLLM's
definitions (bebop.engine.metrics.SpecMetrics), fed to the same DrafterAlarm bebop's own RL loop uses
(bebop.rl.drafter_alarm): a head lost or left stale by a weight sync shows up as the alarm raised.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bebop.engine.metrics import SpecMetrics
from bebop.errors import BebopError
from bebop.mtp.engine_counters import parse_counters
from bebop.rl.drafter_alarm import DrafterAlarm


@dataclass
class EngineMonitor:
    alarm: DrafterAlarm = field(default_factory=DrafterAlarm)
    steps: int = 0
    _last: dict | None = None

    def observe(self, counters: dict) -> dict:
        """Cumulative counters after a step -> that step's metrics, `drafter_alarm` and `alarm_change`."""
        now = parse_counters(counters)
        if now["engine"] != "vllm":
            raise BebopError("EngineMonitor needs per-position counters (vLLM's spec_decode_* names)")
        zero: dict = {"num_drafts": 0.0, "num_draft_tokens": 0.0, "accepted_per_pos": [0.0] * len(now["accepted_per_pos"])}
        last = self._last or zero
        accepted = [int(a - b) for a, b in zip(now["accepted_per_pos"], last["accepted_per_pos"])]
        spec = SpecMetrics(k=len(accepted), num_drafts=int(now["num_drafts"] - last["num_drafts"]),
                           num_draft_tokens=int(now["num_draft_tokens"] - last["num_draft_tokens"]),
                           num_accepted_tokens=sum(accepted), accepted_per_position=accepted)
        if spec.num_drafts < 0:
            raise BebopError("the engine's counters went down: pass its cumulative counters, not per-step ones")
        self._last, self.steps = now, self.steps + 1
        change = self.alarm.observe(spec)
        row = spec.to_dict()
        row.pop("k_histogram")
        return {"step": self.steps, **row, "drafter_alarm": self.alarm.raised, "alarm_change": change}
