"""`bebop sft`: train the embedded-default policy on a task's demonstrations, or a model directory on your rows.

Every SFTConfig field is a flag (generated: commands/config_flags.py), or a key of `--config FILE`."""

from __future__ import annotations

import argparse
import json

from bebop.commands.config_flags import add_config_flags, config_values, require_one_of
from bebop.commands.flags import add_learner_args, add_log_args, add_progress_args
from bebop.commands.outputs import add_out_dir
from bebop.distributed.world import World, env_world
from bebop.sft import DEFAULT_STEPS, SFTConfig, train_sft


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sft", help="supervised training: a small policy from scratch on task demonstrations, "
                                   "or --model DIR on --data FILE")
    add_out_dir(p, "model directory to create (or continue with --resume)")
    add_config_flags(p, SFTConfig)  # and --task or --data
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--resume", action="store_true", help="continue from OUT/train_state.pt")
    add_log_args(p)
    add_progress_args(p)
    add_learner_args(p, check_ranks)
    p.set_defaults(func=run)


def _config(args: argparse.Namespace) -> SFTConfig:
    values = config_values(SFTConfig, args)
    require_one_of(values, ("task", "data"))
    if not values.get("data"):
        values.setdefault("steps", DEFAULT_STEPS.get(values["task"], SFTConfig().steps))  # tuned per task
    return SFTConfig(**values)


def check_ranks(args: argparse.Namespace, nproc: int) -> None:
    World(0, nproc).check_divides(_config(args).batch_size, "--batch-size")


def run(args: argparse.Namespace) -> None:
    metrics = train_sft(args.out, _config(args), resume=args.resume, progress=not args.no_progress,
                        loggers=args.log or (),
                        device=args.device, parallel=args.parallel)
    if env_world().is_main:
        print(json.dumps({k: v for k, v in metrics.items() if k != "config"}))
