"""The loss study: heads trained with each draft loss from the same data, steps and seed,
then RS and TO acceptance measured in the engine at K and temperature T.

    bebop mtp study --model POLICY --task math --out docs/results/loss-math [--steps 200]

Every head starts from the same initialisation (`--seed`), sees the same self-distillation
data in the same order, and is evaluated on the same test prompts with the same generator seed.
Writes OUT/loss_table.json and OUT/loss_table.md (with the command that produced it).
"""

from __future__ import annotations

import shlex
import shutil
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from bebop.fileio import atomic_write_json, atomic_write_text
from bebop.model.checkpoint import save_model
from bebop.mtp.evaluate import evaluate_mtp
from bebop.mtp.train import STATE_FILE, MTPTrainConfig, train_mtp
from bebop.policy import load_policy
from bebop.tasks import get_task

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
    state = torch.load(head_dir / STATE_FILE, weights_only=False)
    return state["step"] if state["config"] == asdict(cfg) else None


def run_loss_study(policy_dir: str | Path, out: str | Path, *, task: str, losses: Sequence[str] = LOSSES,
                   steps: int = 200, depths: int = 5, k: int = 3, temperature: float = 1.0, n_eval: int = 64,
                   num_samples: int = 512, seed: int = 0, ce_warmup: float = 0.0,
                   progress: bool = True) -> list[dict]:
    policy_dir, out = Path(policy_dir), Path(out)
    data_cache = out / "mtp_data"
    rows = []
    for loss in losses:
        head_dir = out / "heads" / loss
        warmup = 0 if loss == "ce" else int(ce_warmup * steps)
        cfg = MTPTrainConfig(loss=loss, depths=depths, steps=steps, temperature=temperature, seed=seed,
                             task=task, num_samples=num_samples, ce_warmup_steps=warmup)
        step = _saved_step(head_dir, cfg)  # a rerun of the study reuses (or resumes) a head with this config
        if step is None or step < steps:
            headed_copy(policy_dir, out / "init", seed)
            train_mtp(out / "init", cfg, out=head_dir, progress=progress, data_cache=data_cache,
                      resume=step is not None)
        evals = evaluate_mtp(load_policy(head_dir, device="cpu"), get_task(task), k=k, temperatures=[temperature],
                             modes=["rs", "to"], n=n_eval, seed=seed, progress=progress)
        by_mode = {e["mode"]: e for e in evals}
        rows.append({"loss": loss, "rs_acceptance_rate": by_mode["rs"]["acceptance_rate"],
                     "to_acceptance_rate": by_mode["to"]["acceptance_rate"],
                     "rs_mean_acceptance_length": by_mode["rs"]["mean_acceptance_length"],
                     "to_mean_acceptance_length": by_mode["to"]["mean_acceptance_length"],
                     "rs_per_position": by_mode["rs"]["acceptance_rate_per_position"],
                     "mean_entropy": by_mode["rs"]["mean_entropy"], "pass_rate": by_mode["rs"]["pass_rate"]})
    meta = {"task": task, "steps": steps, "depths": depths, "k": k, "temperature": temperature, "n_eval": n_eval,
            "num_samples": num_samples, "seed": seed, "ce_warmup": ce_warmup,
            "command": " ".join(shlex.quote(a) for a in sys.argv)}
    atomic_write_json(out / "loss_table.json", {"meta": meta, "rows": rows})
    atomic_write_text(out / "loss_table.md", render_table(meta, rows))
    return rows


def render_table(meta: dict, rows: list[dict]) -> str:
    base = next((r for r in rows if r["loss"] == "ce"), rows[0])
    lines = [f"# Loss study: {meta['task']}, K={meta['k']}, T={meta['temperature']:g}", "",
             f"Heads trained {meta['steps']} steps over {meta['depths']} depths on {meta['num_samples']} "
             f"self-distilled samples (seed {meta['seed']}"
             + (f"; non-ce heads: ce for the first {meta['ce_warmup']:.0%} of steps" if meta.get("ce_warmup") else "")
             + "); acceptance measured by speculative generation on "
             f"{meta['n_eval']} test prompts (vLLM definitions: accepted / drafted tokens).", "",
             "| loss | RS acceptance | vs ce | TO acceptance | vs ce | RS mean accept length | RS per position |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        pos = ", ".join(f"{a:.3f}" for a in r["rs_per_position"])
        lines.append(f"| {r['loss']} | {100 * r['rs_acceptance_rate']:.1f}% | "
                     f"{100 * (r['rs_acceptance_rate'] - base['rs_acceptance_rate']):+.1f} | "
                     f"{100 * r['to_acceptance_rate']:.1f}% | "
                     f"{100 * (r['to_acceptance_rate'] - base['to_acceptance_rate']):+.1f} | "
                     f"{r['rs_mean_acceptance_length']:.2f} | {pos} |")
    lines += ["", f"Mean target entropy of emitted tokens: {rows[0]['mean_entropy']:.3f} nats.", "",
              f"Command: `{meta['command']}`", ""]
    return "\n".join(lines)
