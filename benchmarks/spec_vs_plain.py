"""Rollout throughput: speculative decoding (MTP head) against plain decoding, side by side.

    python benchmarks/spec_vs_plain.py --model DIR [--mode rs] [--k 3] [--batch-sizes 1,8,64]
                                       [--runs 3] [--task math] [--temperature 1.0]

DIR is a policy with a trained MTP head. For each batch size the same task prompts are generated
with plain decoding and with speculative decoding, alternating, `--runs` times; tokens/s counts
every generated token. Prints one JSON line per batch size with the median speedup, the measured
mean acceptance length, and the goal ratio speedup / (0.8 * mean acceptance length).
"""

from __future__ import annotations

import argparse
import json

import torch

from bebop.engine import generate
from bebop.engine.speculative import speculative_generate
from bebop.policy import load_policy
from bebop.rollout import encode_prompts
from bebop.sampling import SamplingParams
from bebop.tasks import get_task
from common import machine, median, timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--mode", default="rs")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--batch-sizes", default="1,8,64")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--task", default="math")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    args = parser.parse_args()
    policy = load_policy(args.model, device="cpu")
    task = get_task(args.task)
    sampling = SamplingParams(args.temperature)
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        prompts = encode_prompts(policy, task.problems("test", batch, seed=batch))
        common = dict(max_new_tokens=args.max_new_tokens, sampling=sampling, stop_ids=policy.stop_ids,
                      pad_id=policy.pad_id)
        stats = {"plain": [], "spec": [], "accept_len": []}

        def run_plain(seed):
            gens = generate(policy.model, prompts, generator=torch.Generator().manual_seed(seed), **common)
            return sum(len(g.token_ids) for g in gens)

        def run_spec(seed):
            gens, metrics = speculative_generate(policy.model, prompts, k=args.k, mode=args.mode,
                                                 generator=torch.Generator().manual_seed(seed), **common)
            stats["accept_len"].append(metrics.mean_acceptance_length)
            return sum(len(g.token_ids) for g in gens)

        run_plain(0), run_spec(0)  # warm up
        ratios = []
        for r in range(args.runs):
            tokens = {}
            t_plain = timed(lambda: tokens.__setitem__("plain", run_plain(r + 1)))
            t_spec = timed(lambda: tokens.__setitem__("spec", run_spec(r + 1)))
            stats["plain"].append(tokens["plain"] / t_plain)
            stats["spec"].append(tokens["spec"] / t_spec)
            ratios.append(stats["spec"][-1] / stats["plain"][-1])
        accept = median(stats["accept_len"])
        print(json.dumps({"batch": batch, "mode": args.mode, "k": args.k, "temperature": args.temperature,
                          "runs": args.runs, "plain_tok_s": median(stats["plain"]), "spec_tok_s": median(stats["spec"]),
                          "speedup_median": median(ratios), "speedup_min": min(ratios), "speedup_max": max(ratios),
                          "mean_acceptance_length": accept, "goal_ratio": median(ratios) / (0.8 * accept)}), flush=True)
    print(json.dumps({"machine": machine()}))


if __name__ == "__main__":
    main()
