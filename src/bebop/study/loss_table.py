"""The fresh head every loss of a study starts from (`headed_copy`), and the report of a loss study's results:
`bebop report OUT/loss_table.json` rebuilds OUT/loss_table.md and its plots from the JSON alone. The study
itself is bebop.study.loss_study (cells of temperature x head size, exact measure, heads trained to
convergence); results of the earlier one-cell study (docs/results: `rows` of sampled acceptance)
are still rendered here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from bebop.errors import BebopError
from bebop.fileio import atomic_write_text
from bebop.model.checkpoint import save_model
from bebop.policy import load_policy

LOSSES = ("ce", "kl", "rkl", "tv", "e2e_tv")


def headed_copy(policy_dir: Path, dst: Path, seed: int, *, intermediate_size: int = 0) -> None:
    """dst = the policy with a fresh MTP head initialised from `seed` (same for every loss); `intermediate_size`
    its MLP width (0: the trunk's)."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(policy_dir, dst, ignore=shutil.ignore_patterns("mtp_data", "*.pt", "*.jsonl"))
    policy = load_policy(dst, device="cpu")
    policy.model.attach_mtp(1, torch.Generator().manual_seed(seed), intermediate_size=intermediate_size)
    save_model(policy.model, dst)


def write_study_report(results: Path, *, plots: bool = True) -> Path:
    """RESULTS.md (and RESULTS.png) beside a loss study's RESULTS.json, from it alone; -> the .md path."""
    from bebop.study.plots import plot_loss_intervals

    data = read_study(results)
    if "cells" in data:  # the converged study's cells (bebop.study.loss_study)
        from bebop.study.loss_report import write_cells_report

        return write_cells_report(results, plots=plots)
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
    if not isinstance(data, dict) or "meta" not in data or not ({"rows", "cells"} & set(data)):
        raise BebopError(f"{results} is not a loss study's results (no meta and rows)")
    return data


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
