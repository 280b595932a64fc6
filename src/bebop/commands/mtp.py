"""`bebop mtp ...`: manage the MTP draft head of a model directory."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

from bebop.errors import BebopError
from bebop.model.checkpoint import save_model
from bebop.policy import load_policy


def add_parser(sub: argparse._SubParsersAction) -> argparse._SubParsersAction:
    p = sub.add_parser("mtp", help="MTP draft heads: init, train, eval")
    mtp_sub = p.add_subparsers(dest="mtp_command", required=True)
    init = mtp_sub.add_parser("init", help="add a freshly initialised MTP head to a model directory")
    init.add_argument("--model", required=True)
    init.add_argument("--out", help="write to this directory instead (the source is copied first)")
    init.add_argument("--num-layers", type=int, default=1)
    init.add_argument("--seed", type=int, default=0)
    init.add_argument("--force", action="store_true", help="replace an existing head")
    init.set_defaults(func=run_init)
    return mtp_sub


def run_init(args: argparse.Namespace) -> None:
    src = Path(args.model)
    policy = load_policy(src, device="cpu")
    if policy.model.mtp is not None and not args.force:
        raise BebopError(f"{src} already has an MTP head; pass --force to replace it")
    dst = Path(args.out) if args.out else src
    if dst != src:
        if dst.exists():
            raise BebopError(f"--out {dst} already exists")
        shutil.copytree(src, dst)
    policy.model.attach_mtp(args.num_layers, torch.Generator().manual_seed(args.seed))
    save_model(policy.model, dst)
    n = sum(p.numel() for p in policy.model.mtp.parameters())
    print(f"added an MTP head ({args.num_layers} layer(s), {n / 1e6:.2f}M parameters) to {dst}")
