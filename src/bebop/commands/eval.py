"""`bebop eval`: pass rate and mean next-token entropy of a policy on a task's test split."""

from __future__ import annotations

import argparse
import json
import sys

import torch
from tqdm import tqdm

from bebop.errors import BebopError
from bebop.policy import load_policy
from bebop.rollout import run_episodes, summarize
from bebop.sampling import SamplingParams
from bebop.tasks import get_task


def add_parser(sub: argparse._SubParsersAction, add_device_args) -> None:
    p = sub.add_parser("eval", help="pass rate and entropy on a task's test problems")
    p.add_argument("--model", required=True)
    p.add_argument("--task", required=True)
    p.add_argument("--n", type=int, default=200, help="number of test problems")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=384)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--difficulty", type=int, default=1)
    add_device_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    if args.n < 1:
        raise BebopError(f"--n must be >= 1, got {args.n}")
    task = get_task(args.task, args.difficulty)
    policy = load_policy(args.model, dtype=args.dtype, device=args.device)
    problems = task.problems("test", args.n, args.seed)
    generator = torch.Generator(device=policy.model.device).manual_seed(args.seed)
    with tqdm(total=len(problems), desc=f"eval {args.task}", unit="problem", file=sys.stderr) as bar:
        episodes = run_episodes(policy, task, problems, sampling=SamplingParams(args.temperature),
                                max_new_tokens=args.max_new_tokens, generator=generator,
                                batch_size=args.batch_size, on_batch=bar.update)
    print(json.dumps({"task": args.task, "temperature": args.temperature, **summarize(episodes)}))
