"""Where a command writes: an `--out` directory must not be a file, and a model (or a head) a user made is
replaced only with `--force` (`bebop init`, `bebop mtp init`). Both checks run before anything is written."""

from __future__ import annotations

import argparse
from pathlib import Path

from bebop.errors import BebopError


def add_out_dir(p: argparse.ArgumentParser, help: str, *, required: bool = True, default: str | None = None) -> None:
    """--out DIR, checked by `check_out_dir` before the command runs (bebop.cli.main)."""
    p.add_argument("--out", required=required, default=default, help=help)
    p.set_defaults(out_is_dir=True)


def check_out_dir(args: argparse.Namespace) -> None:
    """A command's --out directory may exist or not, but must not be a file."""
    if getattr(args, "out_is_dir", False) and args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise BebopError(f"--out {args.out} is a file; give a directory (it is created if missing)")


def holds_model(path: Path) -> bool:
    return (path / "config.json").is_file()


def refuse_to_replace(what: str, force: bool) -> None:
    """A command about to replace what a user made goes on only with --force; `what` says what is there."""
    if not force:
        raise BebopError(f"{what}; pass --force to replace it")
