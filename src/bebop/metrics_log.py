"""Per-step training metrics, the same way for `bebop sft`, `bebop mtp train` and `bebop rl`:
RUN_DIR/<file> (one JSON object per step, appended, flushed and fsynced as it is written) and,
with `tensorboard=True`, every number also as a TensorBoard scalar under RUN_DIR/tb.

    log = MetricsLog(run_dir, "metrics.jsonl", resume_step=0, tensorboard=False, tag="rl")
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
from typing import Any

from bebop.errors import BebopError
from bebop.fileio import atomic_write_text


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


def require_tensorboard():
    """torch's SummaryWriter class, imported lazily; a clear error when tensorboard is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise BebopError("--tensorboard needs the tensorboard package (pip install tensorboard)") from None
    return SummaryWriter


def _rounded(value: Any) -> Any:
    """Six decimals; a small value (a bfloat16 sampler's KL, ~1e-7) six significant digits instead of 0."""
    if not isinstance(value, float):
        return value
    return round(value, 6) if abs(value) >= 1e-3 else float(f"{value:.6g}")


class MetricsLog:
    def __init__(self, run_dir: str | os.PathLike, file_name: str, *, resume_step: int = 0, tensorboard: bool = False,
                 tag: str = "train") -> None:
        self.path = Path(run_dir) / file_name
        self.tag = tag
        kept = read_steps(self.path, resume_step)
        atomic_write_text(self.path, "".join(line + "\n" for line in kept))
        self.last: dict[str, Any] = json.loads(kept[-1]) if kept else {}  # the latest step written
        self.board = require_tensorboard()(str(Path(run_dir) / "tb")) if tensorboard else None
        self.fh = open(self.path, "a", encoding="utf-8")

    def write(self, row: dict[str, Any]) -> None:
        """One step's metrics; row["step"] (int) is its x coordinate."""
        self.last = {k: _rounded(v) for k, v in row.items()}
        self.fh.write(json.dumps(self.last) + "\n")
        self.fh.flush()
        os.fsync(self.fh.fileno())
        if self.board is not None:
            self._scalars(row)

    def _scalars(self, row: dict[str, Any]) -> None:
        assert self.board is not None
        step = row["step"]
        for key, value in row.items():
            values = value if isinstance(value, list) else [value]
            for i, v in enumerate(values):
                if key != "step" and isinstance(v, (bool, int, float)):
                    name = f"{self.tag}/{key}/{i + 1}" if isinstance(value, list) else f"{self.tag}/{key}"
                    self.board.add_scalar(name, float(v), step)

    def close(self) -> None:
        self.fh.close()
        if self.board is not None:
            self.board.close()
