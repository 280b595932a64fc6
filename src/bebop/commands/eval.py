"""`bebop eval`: pass rate and mean next-token entropy of a policy on a task's test split, or on the rows
of your own dataset file (`--data FILE`, each row once, up to --n)."""

from __future__ import annotations

import argparse
import json

import torch

from bebop.commands.flags import add_chat_args, add_progress_args, check_at_least_one, decode_spec
from bebop.decoding import open_engine
from bebop.errors import BebopError
from bebop.policy import load_policy
from bebop.progress import bar as progress_bar
from bebop.rollout import run_episodes, summarize
from bebop.sampling import SamplingParams
from bebop.tasks import TASK_LIST
from bebop.tasks.dataset_task import DatasetTask, run_task


def add_parser(sub: argparse._SubParsersAction, add_device_args) -> None:
    p = sub.add_parser("eval", help="pass rate and entropy on a task's test problems")
    p.add_argument("--model", required=True, help="the policy's model directory")
    p.add_argument("--task", help=f"{TASK_LIST} (or --data FILE)")
    p.add_argument("--data", help="a JSONL or parquet file of prompts (verl or TRL rows), each scored once")
    p.add_argument("--reward", default="", help="with --data: math, module:function or path/to/file.py:function "
                                                "(default: by each row's data_source)")
    p.add_argument("--n", type=int, default=200, help="number of test problems (with --data: at most)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (0 = greedy)")
    p.add_argument("--seed", type=int, default=0, help="seeds the test problems and the sampling")
    p.add_argument("--max-new-tokens", type=int, default=384, help="per response")
    p.add_argument("--batch-size", type=int, default=100, help="problems per engine call")
    p.add_argument("--difficulty", type=int, default=1, help="task difficulty 1 (easiest) .. 3")
    add_device_args(p)
    add_chat_args(p)
    add_progress_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    if args.n < 1:
        raise BebopError(f"--n must be >= 1, got {args.n}")
    check_at_least_one(args, "batch_size", "max_new_tokens")
    if not args.task and not args.data:
        raise BebopError("--task or --data required")
    if args.reward and not args.data:
        raise BebopError("--reward scores rows of --data; the generated tasks score themselves")
    policy = load_policy(args.model, dtype=args.dtype, device=args.device, template_kwargs=args.chat_template_kwargs,
                         state_dtype=args.state_dtype)
    task = run_task(policy, task=args.task, difficulty=args.difficulty, data=args.data or "", reward=args.reward)
    n = min(args.n, len(task.rows)) if isinstance(task, DatasetTask) else args.n
    problems = task.problems("test", n, args.seed)
    generator = torch.Generator(device=policy.model.device).manual_seed(args.seed)
    with open_engine(policy, decode_spec(args), model_dir=args.model, rows=len(problems), batch_size=args.batch_size,
                     max_new_tokens=args.max_new_tokens, sampling=SamplingParams(args.temperature), dtype=args.dtype,
                     seed=args.seed) as decoder:
        with progress_bar(total=len(problems), desc=f"eval {task.name}", unit="problem",
                          enabled=not args.no_progress) as bar:
            episodes = run_episodes(policy, task, problems, sampling=SamplingParams(args.temperature),
                                    max_new_tokens=args.max_new_tokens, generator=generator,
                                    batch_size=args.batch_size, on_batch=bar.update, generate_fn=decoder)
    merged = decoder.metrics  # merged over the calls
    drafting = {"spec": args.spec, "mean_acceptance_length": merged.mean_acceptance_length} if merged else {}
    print(json.dumps({"task": task.name, "temperature": args.temperature, "engine": args.engine, **drafting,
                      **summarize(episodes)}))
