"""Held-out evaluation during RL: the policy's mean reward and pass rate on `--eval-data`.

    evaluator = Evaluator(load_dataset_task(cfg.eval_data, policy, reward=cfg.reward), cfg, policy)
    if evaluator.due(step):
        metrics.eval_reward, metrics.eval_pass_rate = evaluator.run(policy)

Every row once per evaluation, sampled at the run's temperature with a generator seeded the same way
each time, so two evaluations differ only by the policy; with the rollouts' engine (--spec: drafting
with the head, lossless), through a sampler of its own (its own --k auto controller: an async run's
rollout thread keeps the other).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from bebop.policy import Policy
from bebop.rl.config import RLConfig
from bebop.rl.sampler import RolloutSampler
from bebop.rollout import run_episodes, summarize
from bebop.tasks.dataset_task import DatasetTask


class Evaluator:
    def __init__(self, task: DatasetTask, cfg: RLConfig, policy: Policy) -> None:
        self.task, self.cfg = task, cfg
        self.sampler = RolloutSampler(task, policy, cfg)
        self.problems = task.problems("test", len(task.rows), cfg.seed)

    def due(self, step: int) -> bool:
        return step % self.cfg.eval_every == 0 or step == self.cfg.steps

    def run(self, policy: Policy) -> tuple[float, float]:
        """-> (mean reward, pass rate) over every row."""
        cfg, model = self.cfg, self.sampler.rollout_model(policy.model)  # the rollouts' model (--rollout-dtype)
        policy = replace(policy, model=model)
        generator = torch.Generator(device=model.device).manual_seed(cfg.seed)
        was_training = model.training
        model.eval()
        try:
            episodes = run_episodes(policy, self.task, self.problems, sampling=cfg.sampling,
                                    max_new_tokens=cfg.max_new_tokens, generator=generator,
                                    batch_size=cfg.batch_size,
                                    generate_fn=self.sampler.generate_fn(model, len(self.problems), []))
        finally:
            model.train(was_training)
        summary = summarize(episodes)
        return summary["mean_reward"], summary["pass_rate"]
