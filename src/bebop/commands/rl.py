"""`bebop rl`: GRPO with rollouts from the (speculative) engine, sync or async, with online MTP.

Every RLConfig field is a flag (generated: commands/config_flags.py); `--config FILE` reads them
from a TOML or JSON file (a run's own RUN_DIR/config.json works) and flags override it."""

from __future__ import annotations

import argparse
import json

from bebop.commands.config_flags import add_config_flags, config_values, require_one_of
from bebop.commands.flags import add_learner_args, add_log_args, add_progress_args
from bebop.commands.outputs import add_out_dir
from bebop.distributed.world import env_world
from bebop.fields import from_flat
from bebop.rl.config import BACKENDS, Backend, RLConfig, check_learner_ranks

REQUIRED = ("model", "steps")  # and --task or --data


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rl", help="GRPO post-training with speculative rollouts (sync or async)")
    add_out_dir(p, "run directory: config.json, metrics.jsonl, checkpoints, model/")
    add_config_flags(p, RLConfig, required=REQUIRED)
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    add_log_args(p)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    add_progress_args(p)
    p.add_argument("--backend", choices=BACKENDS, default="local",
                   help="where rollouts run: this process, or Ray actors (pip install 'bebop[ray]')")
    p.add_argument("--rollout-workers", type=int, default=1, help="ray: rollout actors (<= max-staleness + 1)")
    p.add_argument("--ray-address", default=None,
                   help="ray: join this cluster (auto, HOST:PORT, ray://HOST:PORT); default: start a local Ray")
    add_learner_args(p, check_ranks)
    p.set_defaults(func=run)


def _config(args: argparse.Namespace) -> RLConfig:
    values = config_values(RLConfig, args)
    require_one_of(values, ("task", "data"))
    values.setdefault("mode", "async" if args.backend == "ray" else RLConfig().mode)
    return from_flat(RLConfig, values)


def check_ranks(args: argparse.Namespace, nproc: int) -> None:
    cfg = _config(args)
    Backend(args.backend, args.rollout_workers, args.ray_address).validate(cfg)
    check_learner_ranks(cfg, nproc)


def run(args: argparse.Namespace) -> None:
    from bebop.rl.loop import train_rl

    summary = train_rl(args.out, _config(args), resume=args.resume, progress=not args.no_progress,
                       loggers=args.log or (), device=args.device,
                       backend=Backend(args.backend, args.rollout_workers, args.ray_address), parallel=args.parallel)
    if env_world().is_main:
        print(json.dumps(summary))
