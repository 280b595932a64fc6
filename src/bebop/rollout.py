"""Episodes: problems -> generations (with the task's environment) -> rewards.

    episodes = run_episodes(policy, task, problems, sampling=SamplingParams(1.0),
                            max_new_tokens=160, generator=g, batch_size=64)

The engine knows nothing about tasks; this module adapts a task's `observe` hook (agent tool
calls) into the engine's observer and scores each finished transcript with the task's reward.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from bebop.engine import Generation, generate
from bebop.policy import Policy, encode_prompt
from bebop.sampling import SamplingParams
from bebop.tasks import Problem, Task

INTERRUPT_TOKEN = "</call>"


@dataclass
class Episode:
    problem: Problem
    generation: Generation
    completion: str  # the transcript after the prompt (observations included, stop token excluded)
    reward: float


def make_observer(policy: Policy, task: Task, problems: Sequence[Problem]) -> Callable[[int, list[int]], list[int] | None]:
    def observe(row: int, token_ids: list[int]) -> list[int] | None:
        text = task.observe(problems[row], policy.codec.decode(token_ids))
        return policy.codec.encode(text) if text else None

    return observe


def encode_prompts(policy: Policy, problems: Sequence[Problem]) -> list[list[int]]:
    return [encode_prompt(policy, problem.prompt, f"a {problem.task} prompt") for problem in problems]


def run_episodes(policy: Policy, task: Task, problems: Sequence[Problem], *, sampling: SamplingParams,
                 max_new_tokens: int, generator: torch.Generator | None, batch_size: int = 64,
                 generate_fn=generate, on_batch: Callable[[int], None] | None = None) -> list[Episode]:
    """Generate and score one episode per problem, `batch_size` rows at a time."""
    interrupt = policy.codec.token_id(INTERRUPT_TOKEN)
    episodes = []
    for start in range(0, len(problems), batch_size):
        chunk = list(problems[start:start + batch_size])
        gens = generate_fn(policy.model, encode_prompts(policy, chunk), max_new_tokens=max_new_tokens,
                           sampling=sampling, stop_ids=policy.stop_ids, generator=generator, pad_id=policy.pad_id,
                           observer=make_observer(policy, task, chunk),
                           interrupt_ids=[interrupt] if interrupt is not None else [])
        for problem, gen in zip(chunk, gens):
            text = policy.codec.decode(gen.completion_ids)
            episodes.append(Episode(problem, gen, text, task.score(problem, text)))
        if on_batch:
            on_batch(len(chunk))
    return episodes


def summarize(episodes: Sequence[Episode]) -> dict:
    """pass_rate (reward == 1), mean_reward, mean_entropy over the policy's tokens (nats), the
    share of policy tokens sampled from a distribution with entropy > 0.5 nats (choice points), n.
    An engine that reports no entropies (vLLM: NaN per token) gives None for the two entropy numbers."""
    n = len(episodes)
    ent = [e for ep in episodes for e, m in zip(ep.generation.entropies, ep.generation.policy_mask) if m]
    known = not any(math.isnan(e) for e in ent)
    return {"n": n,
            "pass_rate": sum(ep.reward >= 1.0 for ep in episodes) / max(n, 1),
            "mean_reward": sum(ep.reward for ep in episodes) / max(n, 1),
            "mean_entropy": sum(ent) / max(len(ent), 1) if known else None,
            "choice_point_fraction": sum(e > 0.5 for e in ent) / max(len(ent), 1) if known else None,
            "mean_completion_tokens": sum(len(ep.generation.token_ids) for ep in episodes) / max(n, 1)}
