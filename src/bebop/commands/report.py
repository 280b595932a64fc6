"""`bebop report RUN_DIR...`: rebuild each demo directory's report.md and plots from its saved
results (bebop.study.report); nothing is trained or generated."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="rebuild a demo's report.md and plots from its saved results")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a `bebop demo --out` directory")
    p.add_argument("--no-plots", action="store_true", help="tables only (no matplotlib needed)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    from bebop.study.report import write_report

    for run_dir in args.run_dirs:
        print(write_report(run_dir, plots=not args.no_plots))
