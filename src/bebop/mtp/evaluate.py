"""Acceptance of an MTP head under RS and TO, at K and at a list of temperatures.

    results = evaluate_mtp(policy, task, k=3, temperatures=[0.3, 0.7, 1.0], modes=["rs", "to"], n=64)

Each result is one (mode, temperature) point: vLLM's acceptance metrics from real speculative
generation on the task's test prompts (agent observations included), plus the mean target
entropy of the emitted tokens and the task's pass rate. With `entropy_bins=N` also the entropy law
per token (bebop.stats.entropy_bins): acceptance per depth in N quantile bins of the target's
entropy, and the first draft's acceptance slope per nat, with intervals over the prompts as clusters.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from bebop.engine.metrics import SpecMetrics, merged
from bebop.engine.speculative import check_spec, speculative_rollout_fn
from bebop.errors import BebopError
from bebop.policy import Policy
from bebop.progress import bar as progress_bar
from bebop.rollout import run_episodes, summarize
from bebop.sampling import SamplingParams
from bebop.stats.entropy_bins import per_token_law
from bebop.tasks import Task


def evaluate_mtp(policy: Policy, task: Task, *, k: int, temperatures: Sequence[float], modes: Sequence[str],
                 n: int, seed: int = 0, max_new_tokens: int = 192, batch_size: int = 64,
                 progress: bool = True, entropy_bins: int = 0) -> list[dict]:
    policy.model.require_mtp()
    if n < 1:
        raise BebopError(f"--n must be >= 1, got {n}")
    for mode in modes:
        check_spec(mode, k)
    problems = task.problems("test", n, seed)
    results = []
    points = [(m, t) for m in modes for t in temperatures]
    for mode, temperature in progress_bar(points, desc="mtp eval", unit="point", enabled=progress):
        sink: list[SpecMetrics] = []
        episodes = run_episodes(policy, task, problems, sampling=SamplingParams(temperature),
                                max_new_tokens=max_new_tokens, batch_size=batch_size,
                                generator=torch.Generator(device=policy.model.device).manual_seed(seed),
                                generate_fn=speculative_rollout_fn(k, mode, sink, log_drafts=entropy_bins > 0))
        summary = summarize(episodes)
        metrics = merged(sink, k)
        row = {"mode": mode, "temperature": temperature, **metrics.to_dict(), "pass_rate": summary["pass_rate"], "n": n}
        if entropy_bins and metrics.draft_log:
            row.update(per_token_law(metrics.draft_log, k, entropy_bins))
        results.append(row)
    return results
