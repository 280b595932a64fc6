"""The engine's cost model on this machine: verify(K+1) / decode(1) by live batch, MTP step / trunk
step, and the speedup it predicts for each K beside the speedup measured.

    python benchmarks/cost_model.py --model DIR [--batches 1,4,16,64] [--max-k 6] [--runs 3] [--compile on]

DIR is a policy with a trained MTP head. The forward costs are `bebop.engine.step_costs.profile`
(the profile --k auto starts from; the fastest of 3 profiles here). The acceptance per depth comes
from one RS run at --max-k on the task's test prompts. The predicted speedup of K drafts over plain
decoding is E(K) * decode(1) / (verify(K+1) + (K + 1) * mtp), E(K) = 1 + sum_j prod_{i<=j} alpha_i
(K draft steps and the refresh). The measured speedup is tokens/s of fixed-K RS decoding over plain
decoding with uniform lengths (no stop: every row lives the whole run, so the batch is what it
says), median of --runs alternating runs. `--compile on`: both arms and the profile on the compiled steps.
"""

from __future__ import annotations

import argparse
import json

import torch

from bebop.engine import generate
from bebop.engine.adaptive import AcceptanceEstimate
from bebop.engine.compiled import COMPILE_CHOICES, compile_steps
from bebop.engine.speculative import speculative_generate
from bebop.engine.step_costs import profile
from bebop.policy import load_policy
from bebop.rollout import encode_prompts
from bebop.sampling import SamplingParams
from bebop.tasks import get_task

from common import machine, median, timed


def acceptance(policy, prompts, max_k: int, tokens: int) -> AcceptanceEstimate:
    """Conditional acceptance per depth from one RS run at K = max_k."""
    _, metrics = speculative_generate(policy.model, prompts, k=max_k, mode="rs", max_new_tokens=tokens,
                                      sampling=SamplingParams(1.0), generator=torch.Generator().manual_seed(0))
    survive = [1.0] + metrics.acceptance_rate_per_position  # P(depth d accepted) = prod_{i<=d} alpha_i
    return AcceptanceEstimate.constant([survive[d + 1] / survive[d] if survive[d] else 0.0 for d in range(max_k)])


def speedup(policy, prompts, k: int, tokens: int, runs: int) -> float:
    common = dict(max_new_tokens=tokens, sampling=SamplingParams(1.0), pad_id=policy.pad_id)
    ratios = []
    for r in range(runs):
        n = {}
        t_plain = timed(lambda: n.__setitem__("plain", generate(
            policy.model, prompts, generator=torch.Generator().manual_seed(r), **common)))
        t_spec = timed(lambda: n.__setitem__("spec", speculative_generate(
            policy.model, prompts, k=k, mode="rs", generator=torch.Generator().manual_seed(r), **common)[0]))
        count = {key: sum(len(g.token_ids) for g in gens) for key, gens in n.items()}
        ratios.append((count["spec"] / t_spec) / (count["plain"] / t_plain))
    return median(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--batches", default="1,4,16,64")
    parser.add_argument("--max-k", type=int, default=6)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--task", default="math")
    parser.add_argument("--compile", default="off", choices=COMPILE_CHOICES)
    args = parser.parse_args()
    policy = load_policy(args.model, device="cpu")
    compile_steps(policy.model, args.compile)
    batches = [int(b) for b in args.batches.split(",")]
    costs = min((profile(policy.model, max_rows=max(batches), max_k=args.max_k) for _ in range(3)),
                key=lambda c: sum(c.trunk.values()))
    task = get_task(args.task)
    for batch in batches:
        prompts = encode_prompts(policy, task.problems("test", batch, seed=batch))
        est = acceptance(policy, prompts, args.max_k, args.tokens)
        speedup(policy, prompts, 1, 8, 1)  # warm-up: compiles this batch size's graphs (plain and k = 1)
        decode = costs.profiled(batch, 0)
        row = {"batch": batch, "decode_ms": round(1e3 * decode, 3),
               "mtp_over_trunk": round(costs.mtp_s(batch) / decode, 3),
               "alpha": [round(a, 3) for a in est.rates()], "k": {}}
        for k in range(1, args.max_k + 1):
            row["k"][k] = {"verify_over_decode": round(costs.trunk_s(batch, k + 1) / decode, 3),
                           "predicted_speedup": round(est.expected_tokens(k) * decode / costs.profiled(batch, k), 3),
                           "measured_speedup": round(speedup(policy, prompts, k, args.tokens, args.runs), 3)}
        print(json.dumps(row), flush=True)
    print(json.dumps({"machine": machine(), "compile": args.compile}))


if __name__ == "__main__":
    main()
