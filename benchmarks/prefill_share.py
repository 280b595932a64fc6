"""The prompts' prefill as a share of a GRPO rollout: 8 task prompts x 8 samples, up to 384 new tokens, T=1.

    python benchmarks/prefill_share.py --model DIR [--difficulties 1,2] [--arms plain,rs:3] [--runs 3]

Times engine/prefill.py's `prefill_prompts` (each distinct prompt prefilled once, its cache copied to its group's
rows) inside plain and speculative generation of one GRPO batch, eager, and prints per (difficulty, arm) the
prefill seconds, the rollout seconds and the share, one value per run (seeds 0, 1, ...; each run other prompts).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

import bebop.engine.generate  # noqa: F401  (the modules, which bebop.engine's functions shadow)
import bebop.engine.speculative  # noqa: F401
from bebop.engine.speculative import speculative_generate
from bebop.policy import load_policy
from bebop.sampling import SamplingParams
from bebop.tasks import get_task

from common import machine

ENGINES = [sys.modules["bebop.engine.generate"], sys.modules["bebop.engine.speculative"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--difficulties", default="1,2")
    parser.add_argument("--arms", default="plain,rs:3")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    policy = load_policy(args.model, device="cpu")
    spent: list[float] = []
    for module in ENGINES:  # the prefill each engine calls, timed
        def timed(*a, _orig=module.prefill_prompts, **kw):
            t0 = time.perf_counter()
            out = _orig(*a, **kw)
            spent.append(time.perf_counter() - t0)
            return out
        module.prefill_prompts = timed
    for difficulty in map(int, args.difficulties.split(",")):
        task = get_task("math", difficulty)
        for arm in args.arms.split(","):
            runs = []
            for seed in range(args.runs):
                prompts = [policy.codec.encode(p.prompt) for p in task.problems("test", 8, seed) for _ in range(8)]
                kw = dict(max_new_tokens=384, sampling=SamplingParams(1.0), stop_ids=policy.stop_ids,
                          generator=torch.Generator().manual_seed(seed))
                spent.clear()
                t0 = time.perf_counter()
                if arm == "plain":
                    ENGINES[0].generate(policy.model, prompts, **kw)
                else:
                    speculative_generate(policy.model, prompts, k=int(arm.split(":")[1]), mode="rs", **kw)
                runs.append((sum(spent), time.perf_counter() - t0))
            print(json.dumps({"difficulty": difficulty, "arm": arm, "prefill_s": [round(a, 3) for a, _ in runs],
                              "rollout_s": [round(b, 3) for _, b in runs],
                              "share": [round(a / b, 3) for a, b in runs]}), flush=True)
    print(json.dumps({"machine": machine()}))


if __name__ == "__main__":
    main()
