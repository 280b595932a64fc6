"""A run that cannot learn must say so: the warning when the first steps give GRPO no advantage.

GRPO scores a rollout against its own group (grpo.group_advantages): a group whose rewards are all equal has
zero advantage. When every group of the run's first WATCH_STEPS steps is such a group (an untrained policy
that scores 0 everywhere, or a task every rollout solves) the policy-gradient term is zero and the policy
does not move. Both loops (sync and async: the same step in loop.py) feed each batch to one watcher:

    watch = FlatRewards(cfg, steps=min(WATCH_STEPS, cfg.steps))   # a resumed run: steps=0, it was told
    message = watch.observe(batch)   # the warning once, at the last watched step if all were flat; else None

A step with any advantage ends the watch: later flat steps are the run's own business (the metrics show them).
"""

from __future__ import annotations

import torch

from bebop.rl.config import RLConfig
from bebop.rl.grpo import group_advantages
from bebop.rl.records import RolloutBatch

WATCH_STEPS = 3  # the first steps that must all be flat for the warning


class FlatRewards:
    def __init__(self, cfg: RLConfig, steps: int = WATCH_STEPS) -> None:
        self.cfg, self.steps = cfg, steps
        self.flat_steps = 0
        self.rewards: set[float] = set()
        self.watching = steps > 0

    def observe(self, batch: RolloutBatch) -> str | None:
        if not self.watching:
            return None
        rewards = torch.tensor(batch.rewards).view(-1, batch.group_size)  # (N, G)
        if group_advantages(rewards).abs().max().item() > 0:
            self.watching = False  # a signal: the run learns
            return None
        self.flat_steps += 1
        self.rewards.update(batch.rewards)
        if self.flat_steps < self.steps:
            return None
        self.watching = False
        return self.message()

    def message(self) -> str:
        cfg = self.cfg
        seen = f"every reward was {next(iter(self.rewards)):g}" if len(self.rewards) == 1 else \
            "every group's rewards were equal"
        sft = f"bebop sft --data FILE --model {cfg.model} --out DIR" if cfg.data else \
            f"bebop sft --task {cfg.task} --out DIR"
        levers = "--group-size or --temperature" if cfg.data else "--difficulty, --group-size or --temperature"
        steps = f"{self.flat_steps} steps" if self.flat_steps > 1 else "step"
        return (f"bebop: warning: in the run's first {steps} {seen}: no advantage, so no policy "
                f"gradient, and the policy does not learn. Start from a policy that solves some prompts and not "
                f"others (`{sft}`, then --model DIR; a `bebop init` model is random), or change {levers} until "
                f"a group's rewards differ")
