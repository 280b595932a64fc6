"""Experiment trackers beside the JSONL log: TensorBoard, Weights & Biases, MLflow (each an optional
package, imported only when asked for).

    check_loggers(["wandb"])                      # before anything is written: a clear error if missing
    trackers = open_loggers(["wandb", "mlflow"], run_dir, tag="rl", config=asdict(cfg))
    for t in trackers: t.scalars(step, {"rl/loss": 0.31, "rl/acceptance_per_depth/1": 0.8})
    for t in trackers: t.close()

Where each writes, and how a resumed run finds its tracker run again:
- tensorboard: RUN_DIR/tb (event files; a resumed run appends).
- wandb: the project in WANDB_PROJECT (default "bebop"), the run named after RUN_DIR, its files under
  RUN_DIR/wandb; WANDB_MODE=offline works without a network (`wandb sync` uploads later). The run id is
  kept in RUN_DIR/wandb_run_id, so a resumed run continues the same W&B run. Scalars are plotted against
  TAG/step (not W&B's own _step), so steps re-run after a resume land on their own x.
- mlflow: the tracking server in MLFLOW_TRACKING_URI, else a file store at RUN_DIR/mlruns; the experiment
  MLFLOW_EXPERIMENT_NAME (default "bebop"); the run id kept in RUN_DIR/mlflow_run_id. The config goes in
  as the run's parameters, each number as a metric at its step (mlflow-skinny is enough).
The JSONL file stays the exact record: on resume it is cut back to the checkpoint, a tracker keeps what
it was sent (a step re-run after a crash appears twice there).
"""

from __future__ import annotations

import importlib
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any, Protocol, Sequence

from bebop.errors import BebopError
from bebop.fileio import atomic_write_text

# the flag's name -> (module imported, what to install)
PACKAGES = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"),
            "mlflow": ("mlflow", "mlflow-skinny")}
LOGGERS = tuple(PACKAGES)
LoggerNames = Sequence[str]  # what --log collects: a subset of LOGGERS


class Tracker(Protocol):
    def __init__(self, run_dir: Path, tag: str, config: dict[str, Any]) -> None: ...
    def scalars(self, step: int, values: dict[str, float]) -> None: ...
    def close(self) -> None: ...


def check_loggers(names: Sequence[str]) -> None:
    """Every name is a known tracker whose package imports; else one line saying what to install."""
    for name in names:
        if name not in PACKAGES:
            raise BebopError(f"--log {name}: unknown logger (choose from {', '.join(LOGGERS)})")
        module, package = PACKAGES[name]
        try:
            importlib.import_module(module)
        except ImportError:
            raise BebopError(f"--log {name} needs the {package} package (pip install {package}, "
                             f"or pip install 'bebop[{name}]')") from None


def open_loggers(names: Sequence[str], run_dir: Path, *, tag: str, config: dict[str, Any] | None) -> list[Tracker]:
    check_loggers(names)
    config = json.loads(json.dumps(config or {}, default=str))  # paths and the like as text
    kinds: dict[str, type[Tracker]] = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker,
                                       "mlflow": MlflowTracker}
    return [kinds[name](run_dir, tag, config) for name in dict.fromkeys(names)]


def _kept_id(path: Path) -> str | None:
    """The tracker run id a run directory keeps (RUN_DIR/wandb_run_id, mlflow_run_id), if any."""
    return (path.read_text().strip() or None) if path.is_file() else None


def _keep_id(path: Path, run_id: str) -> str:
    atomic_write_text(path, run_id + "\n")
    return run_id


class TensorBoardTracker:
    def __init__(self, run_dir: Path, tag: str, config: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / "tb"))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, run_dir: Path, tag: str, config: dict[str, Any]) -> None:
        import wandb

        id_file = run_dir / "wandb_run_id"
        run_id = _kept_id(id_file) or _keep_id(id_file, uuid.uuid4().hex[:12])
        self.step_key = f"{tag}/step"
        self.run = wandb.init(project=None if os.environ.get("WANDB_PROJECT") else "bebop", name=run_dir.name,
                              id=run_id, resume="allow", dir=str(run_dir), config=config, job_type=tag)
        self.run.define_metric(self.step_key)
        self.run.define_metric(f"{tag}/*", step_metric=self.step_key)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self.run.log({self.step_key: step, **values})

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    def __init__(self, run_dir: Path, tag: str, config: dict[str, Any]) -> None:
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:  # mlflow 3 keeps its file store behind this switch; a server is what teams set
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = (run_dir.resolve() / "mlruns").as_uri()
        self.client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "bebop")
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        id_file = run_dir / "mlflow_run_id"
        kept = _kept_id(id_file)
        if kept is not None and self._exists(kept):  # a resumed run: the same MLflow run
            self.run_id = kept
            self.client.update_run(kept, status="RUNNING")
        else:
            run = self.client.create_run(experiment_id, run_name=run_dir.name, tags={"bebop.command": tag})
            self.run_id = _keep_id(id_file, run.info.run_id)
            self._params(config)

    def _exists(self, run_id: str) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_run(run_id)
        except MlflowException:  # kept from another tracking store
            return False
        return True

    def _params(self, config: dict[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(k, json.dumps(v) if not isinstance(v, str) else v) for k, v in sorted(config.items())]
        for i in range(0, len(params), 100):  # mlflow's batch limit on parameters
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def scalars(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, stamp, step) for k, v in values.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
