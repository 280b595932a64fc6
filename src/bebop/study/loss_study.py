"""The loss study: heads trained with each draft loss to convergence, per cell of the
(temperature, head size) axes, measured with the exact expected acceptance on held-out on-policy sequences,
the sampled acceptance beside it.

    results = run_loss_study(POLICY, OUT, StudySpec(task="math", losses=("ce", "e2e_tv"), temperatures=(0.7, 1.0),
                                                    head_sizes=("full", "half"), seeds=(0, 1, 2, 3, 4)))

Per (cell, seed) every loss starts from the same head initialisation and trains on the same self-distilled
samples (drawn at the cell's temperature) in the same order, with the same step cap; the last `held_out`
samples are held out and the head's RS expected acceptance on them is measured every `eval_every` steps: the
best head is kept and training stops after `patience` measures without improvement (bebop.mtp.patience; a
ce warm-up's measures are not counted). Each head is then measured on the cell's test sequences (the policy's
own samples of `n_eval` test prompts at the cell's temperature, the same for every loss and seed): exact RS and
TO acceptance at K (bebop.mtp.heldout) and, with `sampled`, speculative generation's (bebop.mtp.evaluate).
Differences to ce are paired by seed, with 95% t-intervals over seeds. "Equal compute" compares the held-out
curves at the last step every head of the cell reached.

Everything is reused on a rerun: the self-distilled samples and test sequences (cached), each trained head
(resumed if interrupted), each head's measures (OUT/heads/CELL/LOSS-sSEED/study_eval.json, keyed by what was
asked). Writes OUT/loss_table.json and, from it alone, OUT/loss_table.md and per-cell curve and interval plots.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Sequence as Seq
from dataclasses import asdict, dataclass
from pathlib import Path

from bebop.errors import BebopError
from bebop.fileio import atomic_write_json
from bebop.jsonl import read_jsonl
from bebop.model.config import read_config
from bebop.mtp.data import Sequence, load_sequences, sample_sequences, save_sequences
from bebop.mtp.evaluate import evaluate_mtp
from bebop.mtp.exact import ESTIMATOR
from bebop.mtp.heldout import expected_acceptance
from bebop.mtp.train import METRICS_FILE, STATE_FILE, train_mtp
from bebop.mtp.train_config import MTPTrainConfig, saved_config
from bebop.policy import load_policy
from bebop.stats.intervals import mean_interval
from bebop.study.loss_report import cell_name, write_cells_report
from bebop.study.loss_table import headed_copy
from bebop.tasks import get_task
from bebop.train_state import load_train_state

HEAD_SIZES = {"full": 1, "half": 2, "quarter": 4}  # the head's MLP width: the trunk's intermediate size / this
TEST_SEED = 12345  # the test prompts and their samples: one set for every loss and seed of a cell
MEASURES = ("exact_rs_rate", "exact_to_rate", "exact_rs_mean_acceptance_length", "sampled_rs_rate",
            "sampled_to_rate", "best_step")


@dataclass(frozen=True)
class StudySpec:
    task: str = "math"
    losses: tuple[str, ...] = ("ce", "tv", "e2e_tv")
    temperatures: tuple[float, ...] = (1.0,)
    head_sizes: tuple[str, ...] = ("full",)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    steps: int = 400  # the cap, equal for every loss
    depths: int = 5
    k: int = 3
    num_samples: int = 512
    held_out: int = 48
    eval_every: int = 25
    patience: int = 4
    ce_warmup: float = 0.0  # share of the cap the non-ce heads first train with ce
    n_eval: int = 64
    sampled: bool = True

    def __post_init__(self) -> None:
        if not self.losses or "ce" not in self.losses:
            raise BebopError("the loss study compares to ce: --losses must include ce")
        if len(set(self.seeds)) != len(self.seeds) or not self.seeds:
            raise BebopError(f"--seeds must name distinct seeds, got {list(self.seeds)}")
        if not self.temperatures or any(not t > 0 for t in self.temperatures):
            raise BebopError(f"--temperatures must be > 0 (a greedy target has no distribution), got {list(self.temperatures)}")
        for size in self.head_sizes:
            head_size_name(size)
        if not 0 <= self.ce_warmup < 1:
            raise BebopError(f"--ce-warmup is a share of --steps in [0, 1), got {self.ce_warmup}")
        if self.n_eval < 1:
            raise BebopError(f"--n must be >= 1, got {self.n_eval}")
        get_task(self.task)  # an unknown task: its own message
        self.train_config("ce", self.temperatures[0], self.seeds[0])  # MTPTrainConfig checks the rest

    def train_config(self, loss: str, temperature: float, seed: int) -> MTPTrainConfig:
        warmup = 0 if loss == "ce" else int(self.ce_warmup * self.steps)
        return MTPTrainConfig(loss=loss, depths=self.depths, steps=self.steps, temperature=temperature, seed=seed,
                              task=self.task, num_samples=self.num_samples, ce_warmup_steps=warmup,
                              held_out=self.held_out, eval_every=self.eval_every, patience=self.patience,
                              eval_k=self.k, save_every=self.eval_every or 100)


def head_size_name(text: str) -> str:
    if text not in HEAD_SIZES and not (text.isdigit() and int(text) > 0):
        raise BebopError(f"unknown head size {text!r}: full, half, quarter or an MLP width (a positive integer)")
    return text


def head_width(text: str, trunk_intermediate: int) -> int:
    """The head's MLP width for a head-size name; 0 for the trunk's own (the layout engines load)."""
    if text == "full":
        return 0
    return trunk_intermediate // HEAD_SIZES[text] if text in HEAD_SIZES else int(text)


def run_loss_study(policy_dir: str | Path, out: str | Path, spec: StudySpec, *, progress: bool = True) -> dict:
    """Every cell's heads trained and measured; -> the results written to OUT/loss_table.json."""
    policy_dir, out = Path(policy_dir), Path(out)
    cells, runs = [], []
    for temperature in spec.temperatures:
        test = test_sequences(policy_dir, out, spec, temperature, progress)
        for size in spec.head_sizes:
            mine = [one_head(policy_dir, out, spec, loss, seed, temperature, size, test, progress)
                    for seed in spec.seeds for loss in spec.losses]
            runs += mine
            cells.append({"temperature": temperature, "head_size": size, "rows": aggregate(mine, spec.losses),
                          "equal_compute": equal_compute(mine, spec.losses),
                          "test_positions": mine[0]["exact_positions"], "mean_entropy": _mean_entropy(mine)})
    meta = {**asdict(spec), "command": " ".join(shlex.quote(a) for a in sys.argv)}
    results = {"meta": meta, "cells": cells, "runs": runs}
    atomic_write_json(out / "loss_table.json", results)
    write_cells_report(out / "loss_table.json")
    return results


def _mean_entropy(runs: list[dict]) -> float | None:
    """The target's mean entropy over the emitted tokens of the sampled measure (None without it)."""
    values = [r["mean_entropy"] for r in runs if r.get("mean_entropy") is not None]
    return sum(values) / len(values) if values else None


def test_sequences(policy_dir: Path, out: Path, spec: StudySpec, temperature: float, progress: bool) -> list[Sequence]:
    """The policy's own samples of n_eval test prompts at `temperature` (cached in OUT/test_data)."""
    policy = load_policy(policy_dir, device="cpu")
    path = out / "test_data" / f"{spec.task}-n{spec.n_eval}-T{temperature:g}-s{TEST_SEED}.jsonl"
    if path.is_file():
        return load_sequences(path, policy)
    seqs = sample_sequences(policy, get_task(spec.task), n=spec.n_eval, temperature=temperature, seed=TEST_SEED,
                            split="test", progress=progress)
    save_sequences(path, policy, seqs)
    return seqs


def _trained(head_dir: Path, cfg: MTPTrainConfig) -> bool | None:
    """True: a head with exactly this config finished; False: one to resume; None: none to reuse."""
    if not (head_dir / STATE_FILE).is_file():
        return None
    state = load_train_state(head_dir, STATE_FILE, map_location="cpu")
    if saved_config(state) != asdict(cfg):
        return None
    return bool(state.get("stopped")) or state["step"] >= cfg.steps


def one_head(policy_dir: Path, out: Path, spec: StudySpec, loss: str, seed: int, temperature: float, size: str,
             test: list[Sequence], progress: bool) -> dict:
    """Train (or reuse) the head of one (loss, seed) in a cell and measure it (or reuse its measures)."""
    head_dir = out / "heads" / cell_name(temperature, size) / f"{loss}-s{seed}"
    cfg = spec.train_config(loss, temperature, seed)
    done = _trained(head_dir, cfg)
    if not done:
        width = head_width(size, read_config(policy_dir).intermediate_size)
        headed_copy(policy_dir, out / "init", seed, intermediate_size=width)
        train_mtp(out / "init", cfg, out=head_dir, progress=progress, data_cache=out / "mtp_data",
                  resume=done is False, device="cpu")
    key = {"k": spec.k, "n_eval": spec.n_eval, "sampled": spec.sampled, "temperature": temperature,
           "test_seed": TEST_SEED, "config": asdict(cfg), "estimator": ESTIMATOR}
    saved = head_dir / "study_eval.json"
    cached = json.loads(saved.read_text()) if done and saved.is_file() else {}
    if cached.get("key") == key:
        return cached["run"]
    run = {"loss": loss, "seed": seed, "temperature": temperature, "head_size": size,
           **measure_head(head_dir, spec, temperature, seed, test, progress), **curve(head_dir)}
    atomic_write_json(saved, {"key": key, "run": run})
    return run


def measure_head(head_dir: Path, spec: StudySpec, temperature: float, seed: int, test: list[Sequence],
                 progress: bool) -> dict:
    policy = load_policy(head_dir, device="cpu")
    exact = expected_acceptance(policy, test, k=spec.k, temperature=temperature, seed=seed)
    row = {"exact_rs_rate": exact["rs"]["rate"], "exact_to_rate": exact["to"]["rate"],
           "exact_rs_interval": [exact["rs"]["low"], exact["rs"]["high"]],
           "exact_rs_mean_acceptance_length": exact["rs"]["mean_acceptance_length"],
           "exact_rs_per_depth": exact["rs"]["per_depth"], "exact_positions": exact["positions"],
           "sampled_rs_rate": None, "sampled_to_rate": None}
    if spec.sampled:
        evals = evaluate_mtp(policy, get_task(spec.task), k=spec.k, temperatures=[temperature], modes=["rs", "to"],
                             n=spec.n_eval, seed=seed, progress=progress)
        by_mode = {e["mode"]: e for e in evals}
        row |= {"sampled_rs_rate": by_mode["rs"]["acceptance_rate"], "sampled_to_rate": by_mode["to"]["acceptance_rate"],
                "mean_entropy": by_mode["rs"]["mean_entropy"]}
    return row


def curve(head_dir: Path) -> dict:
    """The held-out curve from the head's training log: [[step, RS expected acceptance], ...], and its best step."""
    points = [[row["step"], row["heldout_rs_acceptance"]] for row in read_jsonl(head_dir / METRICS_FILE)
              if "heldout_rs_acceptance" in row]
    state = load_train_state(head_dir, STATE_FILE, map_location="cpu")
    best = state.get("patience", {}).get("best_step") or state["step"]
    return {"curve": points, "best_step": best, "steps_trained": state["step"]}


def aggregate(runs: Seq[dict], losses: Seq[str]) -> list[dict]:
    """Per loss: [mean, low, high] over seeds of each measure, and of its difference to ce paired by seed."""
    by = {(r["loss"], r["seed"]): r for r in runs}
    rows = []
    for loss in losses:
        mine = [r for r in runs if r["loss"] == loss]
        row: dict = {"loss": loss, "seeds": [r["seed"] for r in mine]}
        for m in MEASURES:
            if any(r[m] is None for r in mine):
                continue
            row[m] = list(mean_interval([r[m] for r in mine]))
            if loss != "ce":
                row[f"{m}_vs_ce"] = list(mean_interval([r[m] - by[("ce", r["seed"])][m] for r in mine]))
        rows.append(row)
    return rows


def equal_compute(runs: Seq[dict], losses: Seq[str]) -> dict | None:
    """The held-out RS expected acceptance of every head at the last step all of them reached, per loss (mean
    and interval over seeds) and paired to ce; None without held-out curves."""
    if any(not r["curve"] for r in runs):
        return None
    step = min(r["curve"][-1][0] for r in runs)
    at = {(r["loss"], r["seed"]): dict(map(tuple, r["curve"]))[step] for r in runs}
    rows = {}
    for loss in losses:
        seeds = [s for (name, s) in at if name == loss]
        rows[loss] = {"heldout": list(mean_interval([at[(loss, s)] for s in seeds]))}
        if loss != "ce":
            rows[loss]["vs_ce"] = list(mean_interval([at[(loss, s)] - at[("ce", s)] for s in seeds]))
    return {"step": step, "losses": rows}
