"""`bebop report PATH...`: rebuild reports from saved results alone; nothing is trained or generated.

A demo directory (`bebop demo --out`) gets its report.md and plots (bebop.study.report); a loss
study's results file (`bebop mtp study`: OUT/loss_table.json, or a copy under docs/results) gets
its .md table and .png plot beside it (bebop.study.loss_table).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="rebuild a demo's or a loss study's report from its saved results")
    p.add_argument("run_dirs", nargs="+", metavar="PATH",
                   help="a `bebop demo --out` directory, or a loss study's results .json")
    p.add_argument("--no-plots", action="store_true", help="tables only (no matplotlib needed)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    from bebop.study.loss_table import write_study_report
    from bebop.study.report import write_report

    for path in map(Path, args.run_dirs):
        if path.suffix == ".json":
            print(write_study_report(path, plots=not args.no_plots))
        else:
            print(write_report(path, plots=not args.no_plots))
