"""The speculative engine's measured step time per (live rows, k) against the cost profile `--k auto` predicts
from, in steady state: every row decoding, every step of the same k (a controller that always picks it).

    python benchmarks/step_costs_vs_measured.py --model DIR [--compile on] [--batches 1,8,32,64] [--max-k 4]

Per batch one JSON line: the engine's k = 0 step (ms, median) and the profile's, then per k its measured step over
the k = 0 step beside the profile's ratio, the tokens a step emitted (1 + accepted drafts) and the per-step speedup
over k = 0 (tokens x plain / step): the bound a controller choosing per step reaches at that batch. The steps
counted are those at the full batch, of the second of two passes.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from bebop.engine.adaptive import AdaptiveK
from bebop.engine.compiled import compile_steps
from bebop.engine.speculative import speculative_generate
from bebop.engine.step_costs import StepCosts, step_costs
from bebop.policy import load_policy
from bebop.rollout import encode_prompts
from bebop.sampling import SamplingParams
from bebop.tasks import get_task

from common import machine


class FixedK(AdaptiveK):
    """Every step verifies k drafts; records the full batch's step times and accepted counts."""

    def __init__(self, k: int, max_k: int, costs: StepCosts, full: int) -> None:
        super().__init__(max_k, costs)
        self.k, self.full = k, full
        self.times: list[float] = []
        self.accepted: list[int] = []

    def choose(self, rows: int) -> int:
        return self.k

    def observe(self, rows: int, k: int, seconds: float, accepted: list[int]) -> None:
        if rows == self.full:
            self.times.append(seconds)
            self.accepted += accepted


def measure(policy, prompts, costs: StepCosts, max_k: int) -> dict[int, tuple[float, float]]:
    """k -> (median step seconds at the full batch, tokens a step emits), from the second of two passes."""
    out = {}
    for rep in range(2):
        for k in range(max_k + 1):
            ctl = FixedK(k, max_k, costs, len(prompts))
            speculative_generate(policy.model, prompts, k="auto", max_k=max_k, mode="rs", max_new_tokens=96,
                                 sampling=SamplingParams(1.0), generator=torch.Generator().manual_seed(rep),
                                 controller=ctl)
            if rep:
                out[k] = (statistics.median(ctl.times), 1 + (statistics.mean(ctl.accepted) if ctl.accepted else 0))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--compile", default="off", choices=("on", "off"))
    parser.add_argument("--batches", default="1,8,32,64")
    parser.add_argument("--max-k", type=int, default=4)
    args = parser.parse_args()
    policy = load_policy(args.model, device="cpu")
    compile_steps(policy.model, args.compile)
    batches = [int(b) for b in args.batches.split(",")]
    costs = step_costs(policy.model, max_rows=max(batches), max_k=args.max_k)
    task = get_task("math")
    for batch in batches:
        prompts = encode_prompts(policy, task.problems("test", batch, seed=batch))
        res = measure(policy, prompts, costs, args.max_k)
        plain = res[0][0]
        row: dict = {"batch": batch, "plain_ms": round(plain * 1e3, 2),
                     "profiled_plain_ms": round(costs.profiled(batch, 0) * 1e3, 2)}
        for k in range(1, args.max_k + 1):
            step, tokens = res[k]
            row[k] = {"step/plain": round(step / plain, 2),
                      "profiled": round(costs.profiled(batch, k) / costs.profiled(batch, 0), 2),
                      "tokens": round(tokens, 2), "speedup": round(tokens * plain / step, 2)}
        print(json.dumps(row), flush=True)
    print(json.dumps({"machine": machine(), "compile": args.compile}))


if __name__ == "__main__":
    main()
