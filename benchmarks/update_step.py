"""The GRPO update alone, packed against padded: the same rollout batches, alternating in one process.

    python benchmarks/update_step.py --model DIR [--difficulty 1] [--batches 3] [--passes 5]
                                     [--micro-batch-size 8] [--group-size 8] [--batch-prompts 8]

Samples --batches rollout batches of the task with DIR's policy (plain decoding, the RL sampler's own path), then
times one optimizer step on each with the packed update (each group's prompt once, no padding: model/packing.py)
and with the padded one (rows sorted by length, each micro-batch cut to its longest), the two alternating pass
after pass on one trainer (its weights move with every step; the cost of a step does not). Prints one JSON line per
batch: its prompt and response tokens, the median seconds of each arm, and the median of the per-pass ratios.

What bounds the ratio: the packed forward drops the prompt's repeats (group_size - 1 of every group's prompt tokens)
and the padding; attention, the optimizer step and the per-op costs of a small model stay. A hybrid's Gated DeltaNet
layers keep their rows' padding (they run along rows padded to the micro-batch's longest continuation).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from bebop.fields import from_flat
from bebop.policy import load_policy
from bebop.rl import RLConfig
from bebop.rl.loop import run_task
from bebop.rl.sampler import RolloutSampler
from bebop.rl.trainer import PolicyTrainer

from common import machine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--task", default="math")
    parser.add_argument("--difficulty", type=int, default=1)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--batch-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=384)
    args = parser.parse_args()
    cfg = from_flat(RLConfig, dict(model=args.model, task=args.task, difficulty=args.difficulty, spec="off",
                                   group_size=args.group_size, batch_prompts=args.batch_prompts,
                                   max_new_tokens=args.max_new_tokens, micro_batch_size=args.micro_batch_size))
    policy = load_policy(args.model, device="cpu")
    sampler = RolloutSampler(run_task(policy, task=args.task, difficulty=args.difficulty, data="", reward=cfg.reward),
                             policy, cfg)
    batches = [sampler.collect(policy.model, index=i, policy_version=0) for i in range(args.batches)]
    trainer = PolicyTrainer(policy, cfg)
    for batch in batches:  # first calls: allocations
        trainer.step(batch)
    seconds: dict[tuple[int, bool], list[float]] = {(i, packed): [] for i in range(len(batches)) for packed in (0, 1)}
    for _ in range(args.passes):
        for i, batch in enumerate(batches):
            for packed in (False, True):
                trainer.packed = packed
                start = time.perf_counter()
                trainer.step(batch)
                seconds[i, packed].append(time.perf_counter() - start)
    for i, batch in enumerate(batches):
        padded, packed = seconds[i, False], seconds[i, True]
        print(json.dumps({"batch": i, "prompt_tokens": sum(len(r.prompt_ids) for r in batch.rollouts),
                          "response_tokens": sum(len(r.token_ids) for r in batch.rollouts),
                          "distinct_prompts": len({tuple(r.prompt_ids) for r in batch.rollouts}),
                          "padded_s": round(statistics.median(padded), 3), "packed_s": round(statistics.median(packed), 3),
                          "ratio": round(statistics.median(a / b for a, b in zip(padded, packed, strict=True)), 3),
                          "ratios": [round(a / b, 2) for a, b in zip(padded, packed, strict=True)]}), flush=True)
    print(json.dumps({"machine": machine(), "micro_batch_size": args.micro_batch_size}))


if __name__ == "__main__":
    main()
