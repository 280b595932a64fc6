"""`bebop report PATH...`: rebuild reports from saved results alone; nothing is trained or generated.

A demo directory (`bebop demo --out`) gets its report.md and plots (bebop.study.report); a loss
study's results file (`bebop mtp study`: OUT/loss_table.json, or a copy under docs/results) gets
its .md table and .png plot beside it (bebop.study.loss_table). `--entropy-law OUT.md NAME=RUN_DIR ...` writes the
entropy law across the RL steps of the named runs (bebop.study.rl_entropy).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="rebuild a demo's or a loss study's report from its saved results")
    p.add_argument("run_dirs", nargs="+", metavar="PATH",
                   help="a `bebop demo --out` directory, or a loss study's results .json; with --entropy-law, "
                        "NAME=RL_RUN_DIR per run")
    p.add_argument("--entropy-law", metavar="OUT.md", help="the entropy law across the RL steps of the runs given "
                   "as NAME=RUN_DIR: slopes with intervals, the entropy / mismatch split (and OUT.json, OUT.png)")
    p.add_argument("--window", type=int, default=10, help="with --entropy-law: steps in the first and last windows")
    p.add_argument("--no-plots", action="store_true", help="tables only (no matplotlib needed)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    from bebop.study.loss_table import write_study_report
    from bebop.study.report import write_report

    if args.entropy_law:
        return _entropy_law(args)
    for path in map(Path, args.run_dirs):
        if path.suffix == ".json":
            print(write_study_report(path, plots=not args.no_plots))
        else:
            print(write_report(path, plots=not args.no_plots))


def _entropy_law(args: argparse.Namespace) -> None:
    from bebop.errors import BebopError
    from bebop.study.rl_entropy import entropy_law, write_entropy_law

    runs = {}
    for text in args.run_dirs:
        name, sep, run_dir = text.partition("=")
        if not sep or not name or not run_dir:
            raise BebopError(f"--entropy-law takes runs as NAME=RUN_DIR, got {text!r}")
        runs[name] = Path(run_dir)
    print(write_entropy_law(entropy_law(runs, args.window), Path(args.entropy_law), plots=not args.no_plots))
