"""The entropy law across RL steps (the paper's central figure): per run (a verification rule and a
head), each drafting step's acceptance against the policy's entropy that step, the least-squares slope with
its 95% t-interval, and the change of acceptance from the first to the last steps split into what the entropy
change explains (slope x dH) and the mismatch remainder (the head falling behind the policy).

    law = entropy_law({"TO + ce": RUN1, "RS + ce": RUN2, "RS + e2e_tv": RUN3}, window=10)
    write_entropy_law(law, Path("docs/results/rl-entropy-law.md"))   # and the .png beside it

The step's entropy is the sampler's (`entropy` in metrics.jsonl), the trainer's on the same tokens where the
engine reports none (vLLM). Steps are taken as independent points (a step's rollouts are fresh samples).
"""

from __future__ import annotations

import json
from pathlib import Path

from bebop.errors import BebopError
from bebop.fileio import atomic_write_text
from bebop.jsonl import read_jsonl
from bebop.study.entropy_law import PAPER_SLOPES, fit_line, slope_interval
from bebop.study.report_format import slope_cell, table

MEASURES = (("mean_acceptance_length", "accept length"), ("first_draft", "first-draft acceptance"))


def step_points(run_dir: Path) -> list[dict]:
    """The drafting steps of a run: {"step", "entropy", "mean_acceptance_length", "first_draft", "reward"}."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise BebopError(f"{run_dir} is not an RL run directory (no metrics.jsonl)")
    points = []
    for row in read_jsonl(path):
        if row.get("acceptance_rate") is None:
            continue  # a step without drafting
        entropy = row["entropy"] if row.get("entropy") is not None else row["train_entropy"]
        points.append({"step": row["step"], "entropy": entropy, "reward": row["reward"],
                       "mean_acceptance_length": row["mean_acceptance_length"],
                       "first_draft": row["acceptance_rate_per_position"][0]})
    return points


def run_law(points: list[dict], window: int) -> dict:
    """Slopes per measure and the first-window -> last-window change split into entropy and mismatch parts."""
    xs = [p["entropy"] for p in points]
    if len(set(xs)) < 3:
        raise BebopError(f"the entropy law needs 3 or more drafting steps with distinct entropies, got {len(set(xs))}")
    first, last = points[:window], points[-window:]
    mean = lambda rows, key: sum(r[key] for r in rows) / len(rows)  # noqa: E731
    d_entropy = mean(last, "entropy") - mean(first, "entropy")
    out: dict = {"steps": len(points), "entropy_min": min(xs), "entropy_max": max(xs),
                 "entropy_first": mean(first, "entropy"), "entropy_last": mean(last, "entropy"),
                 "reward_first": mean(first, "reward"), "reward_last": mean(last, "reward")}
    for key, _ in MEASURES:
        fit, low, high = slope_interval(xs, [p[key] for p in points])
        change = mean(last, key) - mean(first, key)
        out[key] = {"slope": fit.slope, "low": low, "high": high, "r2": fit.r2, "first": mean(first, key),
                    "last": mean(last, key), "change": change, "entropy_part": fit.slope * d_entropy,
                    "mismatch_part": change - fit.slope * d_entropy}
    return out


def entropy_law(runs: dict[str, Path], window: int = 10) -> dict:
    if window < 1:
        raise BebopError(f"--window must be >= 1, got {window}")
    out: dict = {"window": window, "runs": {}}
    for name, run_dir in runs.items():
        points = step_points(run_dir)
        out["runs"][name] = {"run_dir": str(run_dir), **run_law(points, window), "points": points}
    return out


def render(law: dict) -> str:
    w = law["window"]
    rows, split = [], []
    for name, r in law["runs"].items():
        ratio = r["entropy_max"] / r["entropy_min"] if r["entropy_min"] > 0 else float("inf")
        rows.append([name, str(r["steps"]), f"{r['entropy_min']:.3f}-{r['entropy_max']:.3f} ({ratio:.1f}x)"]
                    + [slope_cell(r[k]["slope"], r[k]["low"], r[k]["high"]) for k, _ in MEASURES])
        a = r["mean_acceptance_length"]
        split.append([name, f"{r['entropy_first']:.3f} -> {r['entropy_last']:.3f}", f"{a['first']:.3f} -> {a['last']:.3f}",
                      f"{a['change']:+.3f}", f"{a['entropy_part']:+.3f}", f"{a['mismatch_part']:+.3f}",
                      f"{r['reward_first']:.3f} -> {r['reward_last']:.3f}"])
    paper = ", ".join(f"{k} {v:+.2f}" for k, v in PAPER_SLOPES.items())
    lines = ["# Acceptance against the policy's entropy across RL steps", "",
             f"Each drafting step is one point (the step's policy entropy in nats, its acceptance); slopes are least "
             f"squares over the steps, per nat, with 95% t-intervals. The paper's accept-length slopes: {paper}.", ""]
    lines += table(["run", "drafting steps", "entropy range (nats)"] + [f"{label} per nat [95%]" for _, label in MEASURES],
                   rows)
    lines += ["", f"The change of the mean accept length from the first {w} to the last {w} drafting steps, split into "
              "its entropy part (the run's slope x the entropy change) and the mismatch remainder:", ""]
    lines += table(["run", "entropy", "accept length", "change", "entropy part", "mismatch part", "reward"], split)
    return "\n".join(lines + [""])


def write_entropy_law(law: dict, out: Path, *, plots: bool = True) -> Path:
    """OUT.md, OUT.json (the points) and OUT.png."""
    atomic_write_text(out.with_suffix(".json"), json.dumps(law, indent=1) + "\n")
    atomic_write_text(out.with_suffix(".md"), render(law))
    if plots:
        from bebop.study.plots import plot_entropy_law

        curves = [(name, [p["entropy"] for p in r["points"]], [p["mean_acceptance_length"] for p in r["points"]],
                   fit_line([p["entropy"] for p in r["points"]], [p["mean_acceptance_length"] for p in r["points"]]))
                  for name, r in law["runs"].items()]
        plot_entropy_law(curves, out.with_suffix(".png"), "Accept length against policy entropy, per RL step",
                         xlabel="policy entropy of the step's rollouts (nats)")
    return out.with_suffix(".md")
