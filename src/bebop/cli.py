"""The `bebop` command: thin subcommands over the library.

Every user-facing problem is a `BebopError`, printed as one line `error: ...` with exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bebop import __version__
from bebop.commands.flags import add_chat_args, add_device_args, add_progress_args, add_sampling_args
from bebop.commands.outputs import add_out_dir, check_out_dir, holds_model, refuse_to_replace
from bebop.commands.parser import Parser
from bebop.errors import BebopError


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate completions from a model directory")
    p.add_argument("--model", required=True, help="model directory (config.json, safetensors, tokenizer.json)")
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    p.add_argument("--prompts", help="JSONL file with a 'prompt' key per row")
    p.add_argument("--max-new-tokens", type=int, required=True,
                   help="the most new tokens per prompt (fewer where the model's context ends first: finish_reason "
                        "'context')")
    p.add_argument("--ignore-eos", action="store_true",
                   help="do not stop at the stop tokens: every row runs to --max-new-tokens (vLLM's ignore_eos; for "
                        "benchmarks with uniform lengths)")
    add_sampling_args(p)
    p.add_argument("--seed", type=int, default=0, help="seeds the sampling")
    p.add_argument("--batch-size", type=int, default=32, help="prompts per engine call")
    p.add_argument("--out", help="write JSONL here instead of stdout")
    p.add_argument("--metrics-out", help="write the metrics here (else stderr): throughput, and with --spec "
                                         "the acceptance metrics")
    add_device_args(p)
    add_chat_args(p)
    add_progress_args(p)
    p.set_defaults(func=_run_generate)


def _run_generate(args: argparse.Namespace) -> None:
    from bebop.commands.generate import run_generate

    run_generate(args)


def _add_init(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("init", help="write a freshly initialised embedded-default model directory (random weights: "
                                    "`bebop sft` makes a policy worth sampling)")
    add_out_dir(p, "the model directory to write")
    p.add_argument("--seed", type=int, default=0, help="seeds the random weights")
    p.add_argument("--force", action="store_true", help="replace the model --out already holds")
    p.set_defaults(func=_run_init)


def _run_init(args: argparse.Namespace) -> None:
    from bebop.embedded import init_model_dir

    if holds_model(Path(args.out)):
        refuse_to_replace(f"--out {args.out} already holds a model", args.force)
    print(init_model_dir(args.out, seed=args.seed))


def _add_demo(sub: argparse._SubParsersAction) -> None:
    from bebop.commands.demo import add_arguments

    p = sub.add_parser("demo", help="the method's study end to end on the embedded default (report.md + plots)")
    add_arguments(p)
    p.set_defaults(func=_run_demo)


def _run_demo(args: argparse.Namespace) -> None:
    from bebop.commands.demo import run_demo

    run_demo(args)


def build_parser() -> argparse.ArgumentParser:
    from bebop.commands import eval as eval_cmd
    from bebop.commands import mtp as mtp_cmd
    from bebop.commands import report as report_cmd
    from bebop.commands import rl as rl_cmd
    from bebop.commands import sft as sft_cmd
    from bebop.tasks.cli import register as register_tasks

    parser = Parser(prog="bebop", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"bebop {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    _add_init(sub)
    _add_demo(sub)
    sft_cmd.add_parser(sub)
    eval_cmd.add_parser(sub, add_device_args)
    register_tasks(sub)  # tasks sample / score live beside their concept (tasks/cli.py)
    mtp_cmd.add_parser(sub)
    rl_cmd.add_parser(sub)
    report_cmd.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        check_out_dir(args)
        if hasattr(args, "nproc"):  # a learner command: as N ranks (bebop.distributed.launch)
            from bebop.distributed.launch import check_nproc, relaunch, under_launcher

            check_nproc(args.nproc, args.device)
            if args.nproc > 1 and not under_launcher():
                args.learner_check(args, args.nproc)  # bad input refused here, before any rank starts
                return relaunch(args.nproc, argv)
        args.func(args)
    except BebopError as exc:
        from bebop.distributed.world import env_world

        if env_world().is_main:  # every rank meets the same input: one line, from rank 0
            print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
