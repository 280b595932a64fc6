"""Where the demo keeps each stage's artifacts and results (shared by the pipeline and the report).

    DIR/demo_config.json         the DemoConfig of the run (a rerun with another config is refused)
    DIR/policy/                  the policy, when the demo trained it (SFT, resumable)
    DIR/heads/init/              the policy with a fresh head (same init for every loss)
    DIR/heads/mtp_data/          the self-distillation samples every head trains on
    DIR/heads/<loss>/            a trained head (mtp_train_state.pt resumes; mtp_metrics.jsonl)
    DIR/results/policy.json      which policy, trained here or reused, its SFT summary
    DIR/results/head-<loss>.json the head's training summary
    DIR/results/sweep-<loss>.json acceptance and entropy per (mode, temperature) for that head
    DIR/rl/<mode>-<spec>/        one GRPO run: config.json, metrics.jsonl, model/ when finished
    DIR/rl/sync-rs-online-<u>/   the same run as sync-rs with the head updated online (strategy u)
    DIR/rl/sync-<spec>-long/     the long-response configuration (harder prompts: longer answers)
    DIR/report.md, DIR/plots/*.png   rebuilt from the files above by `bebop report DIR`

Every results file is written atomically once its stage is complete, so "the file exists" means
"the stage is done" and a killed demo resumes from the first missing one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CONFIG_FILE = "demo_config.json"
REPORT_FILE = "report.md"
PLOTS_DIR = "plots"
ONLINE_TAG = "-online-"
LONG_TAG = "-long"


@dataclass(frozen=True)
class DemoLayout:
    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def config(self) -> Path:
        return self.root / CONFIG_FILE

    @property
    def policy_dir(self) -> Path:
        return self.root / "policy"

    @property
    def results(self) -> Path:
        return self.root / "results"

    @property
    def policy_result(self) -> Path:
        return self.results / "policy.json"

    @property
    def head_init(self) -> Path:
        return self.root / "heads" / "init"

    @property
    def mtp_data(self) -> Path:
        return self.root / "heads" / "mtp_data"

    def head_dir(self, loss: str) -> Path:
        return self.root / "heads" / loss

    def head_result(self, loss: str) -> Path:
        return self.results / f"head-{loss}.json"

    def sweep_result(self, loss: str) -> Path:
        return self.results / f"sweep-{loss}.json"

    def rl_dir(self, name: str) -> Path:
        """A GRPO run's directory, by its name (rl_name)."""
        return self.root / "rl" / name

    @property
    def report(self) -> Path:
        return self.root / REPORT_FILE

    @property
    def plots(self) -> Path:
        return self.root / PLOTS_DIR


def rl_name(mode: str, spec: str, update: str = "none", drafter: str = "mtp", long: bool = False) -> str:
    """<mode>-<spec>, -<drafter> for a run that drafts other than with the head (--drafter suffix | both),
    -online-<strategy> for a run that updates its head online (RLConfig.mtp_update), and -long for a run of the
    long-response configuration."""
    return (f"{mode}-{spec}" + ("" if drafter == "mtp" else f"-{drafter}")
            + ("" if update == "none" else f"{ONLINE_TAG}{update}") + (LONG_TAG if long else ""))
