"""The loss study: heads trained with each draft loss from the same data, steps and seed,
then RS and TO acceptance measured in the engine at K and temperature T.

    bebop mtp study --model POLICY --task math --out docs/results/loss-math [--steps 200]

Every head starts from the same initialisation (`--seed`), sees the same self-distillation
data in the same order, and is evaluated on the same test prompts with the same generator seed.
Writes OUT/loss_table.json, OUT/loss_table.md (with the command that produced it) and
OUT/loss_table.png (acceptance per loss with its interval over seeds); `bebop report
OUT/loss_table.json` rebuilds the last two from the first.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from bebop.errors import BebopError
from bebop.fileio import atomic_write_json, atomic_write_text
from bebop.model.checkpoint import save_model
from bebop.mtp.evaluate import evaluate_mtp
from bebop.mtp.train import STATE_FILE, MTPTrainConfig, saved_config, train_mtp
from bebop.policy import load_policy
from bebop.study.intervals import mean_interval
from bebop.tasks import get_task
from bebop.train_state import load_train_state

LOSSES = ("ce", "kl", "rkl", "tv", "e2e_tv")


def headed_copy(policy_dir: Path, dst: Path, seed: int) -> None:
    """dst = the policy with a fresh MTP head initialised from `seed` (same for every loss)."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(policy_dir, dst, ignore=shutil.ignore_patterns("mtp_data", "*.pt", "*.jsonl"))
    policy = load_policy(dst, device="cpu")
    policy.model.attach_mtp(1, torch.Generator().manual_seed(seed))
    save_model(policy.model, dst)


def _saved_step(head_dir: Path, cfg: MTPTrainConfig) -> int | None:
    """The step a head trained with exactly this config reached, or None (absent / other config)."""
    if not (head_dir / STATE_FILE).is_file():
        return None
    state = load_train_state(head_dir, STATE_FILE, map_location="cpu")
    return state["step"] if saved_config(state) == asdict(cfg) else None


def run_loss_study(policy_dir: str | Path, out: str | Path, *, task: str, losses: Sequence[str] = LOSSES,
                   steps: int = 200, depths: int = 5, k: int = 3, temperature: float = 1.0, n_eval: int = 64,
                   num_samples: int = 512, seeds: Sequence[int] = (0,), ce_warmup: float = 0.0,
                   progress: bool = True) -> list[dict]:
    """Train and evaluate a head per (loss, seed); -> one row per loss: mean and 95% interval over the
    seeds of each acceptance, and the paired difference to ce (same seed) with its interval."""
    policy_dir, out = Path(policy_dir), Path(out)
    runs = [_one_head(policy_dir, out, task, loss, seed, steps=steps, depths=depths, k=k, temperature=temperature,
                      n_eval=n_eval, num_samples=num_samples, ce_warmup=ce_warmup, progress=progress)
            for seed in seeds for loss in losses]
    rows = aggregate(runs, losses)
    meta = {"task": task, "steps": steps, "depths": depths, "k": k, "temperature": temperature, "n_eval": n_eval,
            "num_samples": num_samples, "seeds": list(seeds), "ce_warmup": ce_warmup,
            "command": " ".join(shlex.quote(a) for a in sys.argv)}
    atomic_write_json(out / "loss_table.json", {"meta": meta, "rows": rows, "runs": runs})
    write_study_report(out / "loss_table.json")
    return rows


def write_study_report(results: Path, *, plots: bool = True) -> Path:
    """RESULTS.md (and RESULTS.png) beside a loss study's RESULTS.json, from it alone; -> the .md path."""
    from bebop.study.plots import plot_loss_intervals

    data = read_study(results)
    meta, rows = data["meta"], data["rows"]
    atomic_write_text(results.with_suffix(".md"), render_table(meta, rows))
    if plots:
        cells = {"RS": [r["rs_acceptance_rate"] for r in rows], "TO": [r["to_acceptance_rate"] for r in rows]}
        plot_loss_intervals([r["loss"] for r in rows], cells, results.with_suffix(".png"),
                            f"Acceptance per draft loss: {meta['task']}, K={meta['k']}, T={meta['temperature']:g}, "
                            f"{len(meta['seeds'])} seed(s)")
    return results.with_suffix(".md")


def read_study(results: Path) -> dict:
    try:
        data = json.loads(results.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BebopError(f"cannot read the loss study {results}: {exc}") from None
    if not isinstance(data, dict) or not {"meta", "rows"} <= set(data):
        raise BebopError(f"{results} is not a loss study's results (no meta and rows)")
    return data


def _one_head(policy_dir: Path, out: Path, task: str, loss: str, seed: int, *, steps: int, depths: int, k: int,
              temperature: float, n_eval: int, num_samples: int, ce_warmup: float, progress: bool) -> dict:
    """Train (or reuse) the head of one (loss, seed) and measure it; the seed sets the head's
    initialisation, its self-distillation samples, their order and the evaluation draws."""
    head_dir = out / "heads" / (loss if seed == 0 else f"{loss}-s{seed}")
    warmup = 0 if loss == "ce" else int(ce_warmup * steps)
    cfg = MTPTrainConfig(loss=loss, depths=depths, steps=steps, temperature=temperature, seed=seed,
                         task=task, num_samples=num_samples, ce_warmup_steps=warmup)
    step = _saved_step(head_dir, cfg)  # a rerun of the study reuses (or resumes) a head with this config
    if step is None or step < steps:
        headed_copy(policy_dir, out / "init", seed)
        train_mtp(out / "init", cfg, out=head_dir, progress=progress, data_cache=out / "mtp_data",
                  resume=step is not None, device="cpu")
    evals = evaluate_mtp(load_policy(head_dir, device="cpu"), get_task(task), k=k, temperatures=[temperature],
                         modes=["rs", "to"], n=n_eval, seed=seed, progress=progress)
    by_mode = {e["mode"]: e for e in evals}
    return {"loss": loss, "seed": seed, "rs_acceptance_rate": by_mode["rs"]["acceptance_rate"],
            "to_acceptance_rate": by_mode["to"]["acceptance_rate"],
            "rs_mean_acceptance_length": by_mode["rs"]["mean_acceptance_length"],
            "to_mean_acceptance_length": by_mode["to"]["mean_acceptance_length"],
            "rs_per_position": by_mode["rs"]["acceptance_rate_per_position"],
            "mean_entropy": by_mode["rs"]["mean_entropy"], "pass_rate": by_mode["rs"]["pass_rate"]}


MEASURES = ("rs_acceptance_rate", "to_acceptance_rate", "rs_mean_acceptance_length")


def aggregate(runs: Sequence[dict], losses: Sequence[str]) -> list[dict]:
    """Per loss: [mean, low, high] of each measure over seeds, and of its paired difference to ce."""
    by = {(r["loss"], r["seed"]): r for r in runs}
    rows = []
    for loss in losses:
        mine = [r for r in runs if r["loss"] == loss]
        row: dict = {"loss": loss, "seeds": [r["seed"] for r in mine],
                     "mean_entropy": sum(r["mean_entropy"] for r in mine) / len(mine),
                     "rs_per_position": [sum(v) / len(mine) for v in zip(*(r["rs_per_position"] for r in mine))]}
        for m in MEASURES:
            row[m] = list(mean_interval([r[m] for r in mine]))
            if ("ce", mine[0]["seed"]) in by:
                row[f"{m}_vs_ce"] = list(mean_interval([r[m] - by[("ce", r["seed"])][m] for r in mine]))
        rows.append(row)
    return rows


def _pct(cell: list[float], signed: bool = False) -> str:
    mean, low, high = (100 * x for x in cell)
    text = f"{mean:+.1f}" if signed else f"{mean:.1f}%"
    return text if low == high else f"{text} [{low:+.1f}, {high:+.1f}]" if signed else f"{text} [{low:.1f}, {high:.1f}]"


def render_table(meta: dict, rows: list[dict]) -> str:
    seeds = meta["seeds"]
    lines = [f"# Loss study: {meta['task']}, K={meta['k']}, T={meta['temperature']:g}", "",
             f"Heads trained {meta['steps']} steps over {meta['depths']} depths on {meta['num_samples']} "
             f"self-distilled samples, {len(seeds)} seed(s) per loss ({', '.join(map(str, seeds))}; a seed sets the "
             "head's initialisation, its samples, their order and the evaluation draws)"
             + (f"; non-ce heads: ce for the first {meta['ce_warmup']:.0%} of steps" if meta.get("ce_warmup") else "")
             + "; acceptance measured by speculative generation on "
             f"{meta['n_eval']} test prompts (vLLM definitions: accepted / drafted tokens). Cells: mean over seeds "
             "[95% t-interval]; 'vs ce' is the paired difference to the ce head of the same seed.", "",
             "| loss | RS acceptance | vs ce (points) | TO acceptance | vs ce (points) | RS mean accept length | "
             "RS per position (mean) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        mal = r["rs_mean_acceptance_length"]
        mal_text = f"{mal[0]:.2f}" + ("" if mal[1] == mal[2] else f" [{mal[1]:.2f}, {mal[2]:.2f}]")
        lines.append(f"| {r['loss']} | {_pct(r['rs_acceptance_rate'])} | "
                     f"{_pct(r['rs_acceptance_rate_vs_ce'], True) if 'rs_acceptance_rate_vs_ce' in r else 'n/a'} | "
                     f"{_pct(r['to_acceptance_rate'])} | "
                     f"{_pct(r['to_acceptance_rate_vs_ce'], True) if 'to_acceptance_rate_vs_ce' in r else 'n/a'} | "
                     f"{mal_text} | {', '.join(f'{a:.3f}' for a in r['rs_per_position'])} |")
    lines += ["", f"Mean target entropy of emitted tokens: {rows[0]['mean_entropy']:.3f} nats.", "",
              f"Command: `{meta['command']}`", ""]
    return "\n".join(lines)
