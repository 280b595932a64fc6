"""`bebop demo`: the method's study end to end on the embedded default (bebop.study.demo_pipeline).

    bebop demo [--out runs/demo] [--policy TRAINED_POLICY_DIR] [--miniature] [--seed S] [--config FILE]

Trains (or reuses) the small math policy, trains MTP heads with ce and e2e_tv, sweeps temperature
for RS and TO acceptance, runs short sync/async GRPO with speculation off and on, and writes
OUT/report.md with plots. Every stage is cached in OUT: a rerun (or a killed run) continues from
the first unfinished stage. `bebop report OUT` rebuilds the report from the saved results.
`--config FILE` (TOML or JSON) sets any DemoConfig field, over the default (or the miniature);
the longer study in docs/results is one such file.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from bebop.commands.flags import add_progress_args


def add_arguments(p: argparse.ArgumentParser) -> None:
    from bebop.commands.outputs import add_out_dir

    add_out_dir(p, "output directory (finished stages are reused)", required=False, default="runs/demo")
    p.add_argument("--seed", type=int, default=None, help="seed of every stage (default: the config's, 0)")
    p.add_argument("--policy", default="", help="reuse this trained policy directory instead of training one")
    p.add_argument("--miniature", action="store_true",
                   help="a tiny model and a few steps per stage (about a minute; a smoke test, not a result)")
    p.add_argument("--config", type=Path, default=None,
                   help="a TOML / JSON file of DemoConfig fields (bebop/study/demo_pipeline.py) over the defaults")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N (evaluation and RL)")
    add_progress_args(p)


def run_demo(args: argparse.Namespace) -> None:
    from bebop.commands.config_flags import read_config_file
    from bebop.study.demo_pipeline import DemoConfig, run_demo_pipeline

    cfg = DemoConfig.miniature() if args.miniature else DemoConfig()
    if args.config is not None:
        cfg = DemoConfig.from_json({**cfg.to_json(), **read_config_file(args.config, DemoConfig)})
    if args.seed is not None:
        cfg = replace(cfg, seed=args.seed)
    if args.policy:
        cfg = replace(cfg, policy=args.policy)
    report = run_demo_pipeline(args.out, cfg, progress=not args.no_progress, device=args.device)
    print(report)
