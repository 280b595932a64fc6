"""Rollout throughput on Ray: 1 vs N rollout workers, beside the local async source, side by side.

    python benchmarks/ray_workers.py --model DIR [--workers 1,2] [--batches 8] [--task math]
                                     [--spec rs --k 3] [--batch-prompts 4] [--group-size 4]
                                     [--max-new-tokens 64] [--ray-address ADDR]

Pure rollout throughput: each source is drained of `--batches` batches by a learner that trains
nothing (it publishes the same weights after each batch, so weight sync is still paid), the way the
RL loop drives it; rollouts/s = rollouts consumed / wall seconds, after one warm-up batch (actor
start-up and the first weight load are excluded). The sources run alternately, `--runs` times, and
the median is reported. Every source gets max_staleness = max(--workers) - 1 (the least that lets
that many workers sample at once; at least 1, the default). Prints one JSON line per source with its
rollouts/s and its ratio to the local async source and to 1 Ray worker, then the machine.

With a local Ray each worker is a process with 1 CPU thread (Ray sets OMP_NUM_THREADS=1); on a
2-core machine expect at most ~2x from 2 workers, less while other processes use the cores.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from bebop.fields import from_flat
from bebop.policy import load_policy
from bebop.rl.async_loop import AsyncSource
from bebop.rl.config import RLConfig
from bebop.rl.ray_backend import RaySource
from bebop.rl.ray_connect import connect, require_ray
from bebop.rl.sampler import RolloutSampler
from bebop.tasks import get_task

from common import machine, median


def drain(source, model, batches: int) -> tuple[float, int]:
    """-> (seconds, rollouts) for `batches` batches after one warm-up batch."""
    version = 0
    source.next_batch(version)
    source.publish(model, version)
    t0, rollouts = time.perf_counter(), 0
    for _ in range(batches):
        rollouts += len(source.next_batch(version).batch.rollouts)
        source.publish(model, version)
    return time.perf_counter() - t0, rollouts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--task", default="math")
    parser.add_argument("--spec", default="rs")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--batch-prompts", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--ray-address", default=None, help="default: a local Ray with one CPU per worker")
    args = parser.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    policy = load_policy(args.model, device="cpu")
    require_ray()
    owns = connect(args.ray_address, max(workers))
    staleness = max(1, max(workers) - 1)
    results: dict[str, list[float]] = {}
    sources = [("local-async", None)] + [(f"ray-{n}", n) for n in workers]
    try:
        for _ in range(args.runs):
            for name, n in sources:
                cfg = from_flat(RLConfig, dict(model=args.model, task=args.task, mode="async", spec=args.spec, k=args.k,
                                               group_size=args.group_size, batch_prompts=args.batch_prompts,
                                               max_new_tokens=args.max_new_tokens, max_staleness=staleness))
                sampler = RolloutSampler(get_task(args.task), policy, cfg)
                source = (AsyncSource(sampler, policy.model, start_index=0, max_staleness=staleness) if n is None else
                          RaySource(sampler, policy.model, start_index=0, max_staleness=staleness, workers=n))
                try:
                    seconds, rollouts = drain(source, policy.model, args.batches)
                finally:
                    source.close()
                results.setdefault(name, []).append(rollouts / seconds)
    finally:
        if owns:
            require_ray().shutdown()
    local, one = median(results["local-async"]), median(results.get("ray-1", [float("nan")]))
    for name, _ in sources:
        rate = median(results[name])
        print(json.dumps({"source": name, "rollouts_per_s": round(rate, 2), "vs_local_async": round(rate / local, 3),
                          "vs_ray_1_worker": round(rate / one, 3), "runs": args.runs, "batches": args.batches}))
    print(json.dumps({"machine": machine(), "torch_threads_learner": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
