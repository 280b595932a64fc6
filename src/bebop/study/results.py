"""A demo directory's saved results, read back (nothing is rerun): what the report is built from.

    res = load_results("runs/demo")   # -> DemoResults: config, policy, heads, sweeps, RL runs

Reads the files of bebop.study.layout: demo_config.json, results/*.json and the RL runs'
metrics.jsonl (every run directory under rl/, in the order sync before async, spec off before
to before rs, the frozen head before online updates, the long-response configuration last).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from bebop.errors import BebopError
from bebop.jsonl import read_jsonl
from bebop.study.layout import LONG_TAG, ONLINE_TAG, DemoLayout

BASELINE_RUN = "sync-off"
TV_LOSSES = ("tv", "e2e_tv")
MODE_NAMES = {"rs": "RS", "to": "TO"}
RUN_MODES = ("sync", "async")
RUN_SPECS = ("off", "to", "rs")


@dataclass
class RLRun:
    name: str  # <mode>-<spec>[-<drafter>][-online-<strategy>][-long] (layout.rl_name)
    config: dict  # RUN_DIR/config.json
    rows: list[dict]  # RUN_DIR/metrics.jsonl
    log: str  # the metrics file, relative to the demo directory
    finished: bool  # every configured step is in metrics.jsonl


@dataclass
class DemoResults:
    root: Path
    config: dict = field(default_factory=dict)
    policy: dict | None = None
    heads: dict[str, dict] = field(default_factory=dict)
    sweeps: dict[str, dict] = field(default_factory=dict)
    rl: dict[str, RLRun] = field(default_factory=dict)

    @property
    def losses(self) -> list[str]:
        order = list(self.config.get("losses", []))
        return order + sorted((set(self.sweeps) | set(self.heads)) - set(order))

    @property
    def warmup(self) -> int:
        return int(self.config.get("rl_warmup_steps", 1))


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise BebopError(f"{path} is not valid JSON ({exc.msg})") from None


def load_results(root: str | Path) -> DemoResults:
    layout = DemoLayout(Path(root))
    if not layout.root.is_dir():
        raise BebopError(f"no such directory: {layout.root}")
    res = DemoResults(layout.root)
    if layout.config.is_file():
        res.config = _read_json(layout.config)
    if layout.policy_result.is_file():
        res.policy = _read_json(layout.policy_result)
    for path in sorted(layout.results.glob("head-*.json")):
        res.heads[path.stem.removeprefix("head-")] = _read_json(path)
    for path in sorted(layout.results.glob("sweep-*.json")):
        res.sweeps[path.stem.removeprefix("sweep-")] = _read_json(path)
    rl_root = layout.root / "rl"
    for run in sorted(rl_root.glob("*/metrics.jsonl"), key=lambda p: _run_order(p.parent.name)):
        run_dir = run.parent
        cfg = _read_json(run_dir / "config.json") if (run_dir / "config.json").is_file() else {}
        rows = sorted(read_jsonl(run, required=("step", "reward", "step_s", "rollout_s", "train_s")),
                      key=lambda r: r["step"])
        finished = bool(rows) and rows[-1]["step"] >= cfg.get("steps", math.inf)  # every configured step logged
        res.rl[run_dir.name] = RLRun(run_dir.name, cfg, rows, str(run.relative_to(layout.root)), finished)
    if not (res.config or res.policy or res.heads or res.sweeps or res.rl):
        raise BebopError(f"{layout.root} holds no demo results (no demo_config.json, results/ or rl/*/metrics.jsonl)")
    return res


def base_run(name: str) -> str:
    """The run a name updates online from: sync-rs-online-ce -> sync-rs (a frozen-head run is its own)."""
    return name.split(ONLINE_TAG, 1)[0]


def is_long(name: str) -> bool:
    """Whether a run is of the long-response configuration (layout.rl_name's -long)."""
    return name.endswith(LONG_TAG)


def baseline_of(name: str) -> str:
    """The run without speculation that a run's speedup is over: sync-off of its own configuration."""
    return BASELINE_RUN + (LONG_TAG if is_long(name) else "")


def online_strategy(name: str) -> str:
    """The online MTP strategy of a run from its name (layout.rl_name): "none" for a frozen head."""
    return name.split(ONLINE_TAG, 1)[1] if ONLINE_TAG in name else "none"


def _run_order(name: str) -> tuple:
    """The long-response configuration after the rest; sync before async, spec off before to before rs, the
    frozen head before online updates, the head's drafts before other drafters', then by name."""
    mode, _, rest = base_run(name.removesuffix(LONG_TAG)).partition("-")
    spec, _, drafter = rest.partition("-")
    return (is_long(name), RUN_MODES.index(mode) if mode in RUN_MODES else 9,
            RUN_SPECS.index(spec) if spec in RUN_SPECS else 9, online_strategy(name) != "none", drafter, name)
