"""The learner's side of a training run, one setup for sft, mtp train and rl: the run's checks and the ranks joined,
the training forward over the ranks with its optimizer, the metrics log and the progress bar on rank 0, the state
gathered to rank 0 for a save, and each rank's memory in the run's summary.

    world, device = join_world(device, parallel, loggers, batch_size=cfg.batch_size)
    learner = Learner(Parallel(world, parallel, model, Logits(model)), optimizer)
    log = learner.metrics_log(out, METRICS_FILE, start=start, loggers=loggers, tag="sft", config=asdict(cfg))
    bar = learner.progress(start, cfg.steps, desc="sft math", enabled=progress)
    for step in range(start, cfg.steps):
        ...; optimizer.step(); learner.stepped(); bar.update()
        if (state := learner.gathered()) is not None:     # every rank calls; rank 0 gets (whole model, optimizer)
            save(*state)
    summary = {..., **learner.summary()}                   # learner, peak_memory_mb and state_mb per rank
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bebop.distributed.parallel import Parallel, check_parallel
from bebop.distributed.world import World, init_world, peak_memory_mb
from bebop.loggers import LoggerNames, check_loggers
from bebop.metrics_log import NO_LOG, MetricsLog
from bebop.model.qwen3 import CausalLM
from bebop.progress import bar as progress_bar


def join_world(device: str, parallel: str, loggers: LoggerNames, batch_size: int | None = None) -> tuple[World, str]:
    """The run's learner settings checked (before anything is written), then this process's rank and device; a batch
    every rank takes an equal share of (`batch_size`, the --batch-size flag) checked against the ranks."""
    check_loggers(loggers)
    check_parallel(parallel)
    world, device = init_world(device)
    if batch_size is not None:
        world.check_divides(batch_size, "--batch-size")
    return world, device


@dataclass
class Learner:
    """The training forward over the ranks (`par`) and the optimizer of its parameters, with what every run reports
    of them: its layout and each rank's memory."""

    par: Parallel
    optimizer: torch.optim.Optimizer
    peak_mb: float = 0.0  # this rank's peak memory (MB) over the training steps
    state_mb: float = 0.0  # what this rank holds of weights, gradients and optimizer state

    @property
    def world(self) -> World:
        return self.par.world

    def stepped(self) -> None:
        """After an optimizer step: this rank's memory so far (before a save gathers the state on rank 0)."""
        self.peak_mb = peak_memory_mb(self.par.model.device)
        self.state_mb = self.par.state_mb(self.optimizer)

    def gathered(self) -> tuple[CausalLM, dict] | None:
        """The whole model and the optimizer's state in one process's layout, on rank 0; None on the others. Every
        rank calls (the gathers are collective)."""
        full = self.par.full_model()
        optimizer = self.par.optimizer_state(self.optimizer)
        return (full, optimizer) if full is not None and optimizer is not None else None

    def restore(self, optimizer_state: dict) -> None:
        """A saved optimizer state (one process's layout) onto this rank's parameters."""
        self.par.load_optimizer_state(self.optimizer, optimizer_state)

    def metrics_log(self, out: Path, file: str, *, start: int, loggers: LoggerNames, tag: str,
                    config: dict) -> MetricsLog:
        """The run's per-step log (rank 0; the others write nothing), its config with the learner's layout."""
        if not self.world.is_main:
            return NO_LOG
        return MetricsLog(out, file, resume_step=start, loggers=loggers, tag=tag,
                          config=config | {"learner": self.par.describe()})

    def progress(self, start: int, total: int, *, desc: str, enabled: bool) -> Any:
        """The run's progress bar (rank 0; silent on the others) at step `start` of `total`: .update() after each
        step, .set_postfix(...) for its metrics, .close() at the end."""
        return progress_bar(initial=start, total=total, desc=desc, unit="step", enabled=enabled and self.world.is_main)

    def summary(self) -> dict:
        """The learner's layout and, per rank, its peak memory and state over the training steps (MB; a run that
        had no step left to take, e.g. resumed when done, measures them now)."""
        if not self.peak_mb:
            self.stepped()
        return {"learner": self.par.describe(),
                "peak_memory_mb": [round(m, 1) for m in self.world.gather(self.peak_mb)],
                "state_mb": [round(m, 1) for m in self.world.gather(self.state_mb)]}
