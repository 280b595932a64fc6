"""Rollouts of GRPO groups with each drafter: plain decoding, the MTP head, and the suffix index (the group's
siblings, then the earlier epoch's responses), in one process, arms alternating.

    python benchmarks/drafters.py --model DIR [--prompts 8] [--group 8] [--max-new-tokens 384] [--runs 3]
                                  [--arms plain,mtp:3,mtp:auto,suffix:3,both:auto:m4] [--difficulty 3]

DIR is a policy with a trained MTP head (the suffix arms do not use it). Each arm decodes the same batch, --prompts
math test prompts each repeated --group times (a GRPO batch), twice through one engine: epoch 1 (the suffix index
knows the prompts and the siblings as they are sampled) and epoch 2 (the same prompts with another seed: epoch 1's
responses are history). Prints one JSON line per arm and epoch: median tokens/s over runs, the median of each
run's ratio to plain decoding of the same epoch, and the mean acceptance length.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from bebop.decoding import DecodeSpec, auto_controller, generate_fn
from bebop.engine.speculative import parse_k
from bebop.engine.suffix_drafter import MIN_MATCH
from bebop.engine.suffix_index import SuffixIndex
from bebop.policy import encode_prompt, load_policy
from bebop.sampling import SamplingParams
from bebop.tasks import get_task

from common import machine, median


def run_arm(policy, prompts: list[list[int]], arm: str, max_new_tokens: int, seed: int) -> list[dict]:
    """Both epochs of one arm through one generate function -> [{seconds, tokens, accept_len}] per epoch."""
    drafter, _, k = arm.partition(":")
    k, _, min_match = k.partition(":m")  # DRAFTER:K:mN: the index's shortest drafting match is N tokens
    if min_match:
        MIN_MATCH[drafter] = int(min_match)
    spec = DecodeSpec() if drafter == "plain" else DecodeSpec(spec="rs", k=parse_k(k), drafter=drafter, compile="off")
    sink: list = []
    controller = auto_controller(policy.model, spec, len(prompts), SamplingParams(1.0))
    fn = generate_fn(spec, sink, controller, SuffixIndex() if drafter in ("suffix", "both") else None)
    out = []
    for epoch in range(2):
        generator = torch.Generator().manual_seed(seed * 10 + epoch)
        t0 = time.perf_counter()
        gens = fn(policy.model, prompts, max_new_tokens=max_new_tokens, sampling=SamplingParams(1.0),
                  stop_ids=policy.stop_ids, generator=generator, pad_id=policy.pad_id)
        seconds = time.perf_counter() - t0
        out.append({"seconds": seconds, "tokens": sum(len(g.token_ids) for g in gens),
                    "accept_len": sink[-1].mean_acceptance_length if sink else 1.0,
                    "by_source": sink[-1].to_dict()["by_source"] if sink else {}})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=384)
    parser.add_argument("--difficulty", type=int, default=1)
    parser.add_argument("--arms", default="plain,mtp:auto,suffix:3,both:3,both:auto")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    policy = load_policy(args.model)
    problems = get_task("math", args.difficulty).problems("test", args.prompts, seed=0)
    prompts = [encode_prompt(policy, p.prompt, "a math prompt") for p in problems for _ in range(args.group)]
    arms = args.arms.split(",")
    results: dict[str, list[list[dict]]] = {arm: [] for arm in arms}
    run_arm(policy, prompts[:2], arms[0], 8, 0)  # warm-up: allocator, first calls
    for run in range(args.runs):
        for arm in arms[run % len(arms):] + arms[:run % len(arms)]:  # the order rotates
            results[arm].append(run_arm(policy, prompts, arm, args.max_new_tokens, run))
    for arm in arms:
        for epoch in range(2):
            per_run = [r[epoch] for r in results[arm]]
            plain = [r[epoch] for r in results.get("plain", [])]
            ratios = [(p["seconds"] / p["tokens"]) / (a["seconds"] / a["tokens"]) for a, p in zip(per_run, plain)]
            print(json.dumps({"arm": arm, "epoch": epoch + 1, "rows": len(prompts),
                              "tokens_per_s": round(median([r["tokens"] / r["seconds"] for r in per_run]), 1),
                              "vs_plain": round(median(ratios), 3) if ratios else None,
                              "vs_plain_range": [round(min(ratios), 3), round(max(ratios), 3)] if ratios else None,
                              "accept_len": round(median([r["accept_len"] for r in per_run]), 2),
                              "by_source": per_run[-1]["by_source"],  # the last run's
                              "machine": machine()}))


if __name__ == "__main__":
    main()
