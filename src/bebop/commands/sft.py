"""`bebop sft`: train the embedded-default policy on a task's demonstrations."""

from __future__ import annotations

import argparse
import json

from bebop.sft import DEFAULT_STEPS, SFTConfig, train_sft


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sft", help="train a small policy from scratch on task demonstrations")
    p.add_argument("--task", required=True, help="math, code, agent or mix")
    p.add_argument("--out", required=True, help="model directory to create (or continue with --resume)")
    defaults = SFTConfig()
    p.add_argument("--steps", type=int, help="default: per task, tuned for a 20-70%% pass rate")
    p.add_argument("--batch-size", type=int, default=defaults.batch_size)
    p.add_argument("--lr", type=float, default=defaults.lr)
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--difficulty", type=int, default=defaults.difficulty, help="1 (easiest) .. 3")
    p.add_argument("--save-every", type=int, default=defaults.save_every)
    p.add_argument("--resume", action="store_true", help="continue from OUT/train_state.pt")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    steps = args.steps or DEFAULT_STEPS.get(args.task, SFTConfig().steps)
    cfg = SFTConfig(task=args.task, steps=steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                    difficulty=args.difficulty, save_every=args.save_every)
    metrics = train_sft(args.out, cfg, resume=args.resume)
    print(json.dumps({k: v for k, v in metrics.items() if k != "config"}))
