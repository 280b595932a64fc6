"""Per-step training metrics, the same way for `bebop sft`, `bebop mtp train` and `bebop rl`:
RUN_DIR/<file> (one JSON object per step, appended, flushed and fsynced as it is written) and every
number also to the trackers named in `loggers` (tensorboard, wandb, mlflow: bebop.loggers), as TAG/KEY.

    log = MetricsLog(run_dir, "metrics.jsonl", resume_step=0, loggers=["wandb"], tag="rl", config=asdict(cfg))
    log.write({"step": 1, "loss": 0.31, "acceptance_per_depth": [0.8, 0.6]})
    log.close()

On resume the file is first cut (atomically) to the steps <= resume_step, so a step that ran after
the last checkpoint and is run again is never counted twice; a line torn by a kill is dropped too.
Floats are rounded to 6 significant decimals; lists of numbers become one scalar per element.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

from bebop.fileio import atomic_write_text
from bebop.loggers import open_loggers


def read_steps(path: Path, upto: int) -> list[str]:
    """The valid lines of `path` whose step is <= upto (torn or later lines dropped)."""
    if not path.is_file():
        return []
    kept = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= upto:
            kept.append(line)
    return kept


def _rounded(value: Any) -> Any:
    """Six decimals; a small value (a bfloat16 sampler's KL, ~1e-7) six significant digits instead of 0."""
    if not isinstance(value, float):
        return value
    return round(value, 6) if abs(value) >= 1e-3 else float(f"{value:.6g}")


class MetricsLog:
    def __init__(self, run_dir: str | os.PathLike, file_name: str, *, resume_step: int = 0, loggers: Sequence[str] = (),
                 tag: str = "train", config: dict[str, Any] | None = None) -> None:
        self.path = Path(run_dir) / file_name
        self.tag = tag
        kept = read_steps(self.path, resume_step)
        atomic_write_text(self.path, "".join(line + "\n" for line in kept))
        self.last: dict[str, Any] = json.loads(kept[-1]) if kept else {}  # the latest step written
        self.trackers = open_loggers(loggers, Path(run_dir), tag=tag, config=config)
        self.fh = open(self.path, "a", encoding="utf-8")

    def write(self, row: dict[str, Any]) -> None:
        """One step's metrics; row["step"] (int) is its x coordinate."""
        self.last = {k: _rounded(v) for k, v in row.items()}
        self.fh.write(json.dumps(self.last) + "\n")
        self.fh.flush()
        os.fsync(self.fh.fileno())
        if self.trackers:
            scalars = flat_scalars(row, self.tag)
            for tracker in self.trackers:
                tracker.scalars(row["step"], scalars)

    def close(self) -> None:
        self.fh.close()
        for tracker in self.trackers:
            tracker.close()


class _NoLog:
    """What ranks other than 0 log to: nothing (rank 0 writes the run's metrics)."""

    last: dict[str, Any] = {}

    def write(self, row: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


NO_LOG: Any = _NoLog()


def flat_scalars(row: dict[str, Any], tag: str) -> dict[str, float]:
    """A step's numbers as TAG/KEY (a list: TAG/KEY/1, TAG/KEY/2, ...); None, text and the step itself left out."""
    flat = {}
    for key, value in row.items():
        values = value if isinstance(value, list) else [value]
        for i, v in enumerate(values):
            if key != "step" and isinstance(v, (bool, int, float)):
                flat[f"{tag}/{key}/{i + 1}" if isinstance(value, list) else f"{tag}/{key}"] = float(v)
    return flat
