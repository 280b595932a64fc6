"""The figures of `bebop mtp diagnose` (beside diagnosis.md): acceptance per depth, mean acceptance length
against K, and depth-1 acceptance against the target's entropy, RS and TO, from the report's numbers."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from bebop.stats.figures import finish_figure

RULES = (("rs", "RS (rejection sampling)"), ("to", "TO (target-only)"))


def write_plots(report: dict, out: Path) -> list[Path]:
    return [_per_depth(report, out / "acceptance_per_depth.png"), _length(report, out / "acceptance_length.png"),
            _entropy(report, out / "acceptance_vs_entropy.png")]


def _per_depth(r: dict, path: Path) -> Path:
    fig = Figure(figsize=(6.0, 4.2))
    ax = fig.add_subplot()
    depths = list(range(1, r["k"] + 1))
    for i, (mode, label) in enumerate(RULES):
        values = [float("nan") if x is None else x for x in r[f"{mode}_acceptance_per_depth"]]
        bounds = [[lo, hi] if lo is not None else [x, x] for (lo, hi), x in zip(r[f"{mode}_acceptance_intervals"], values)]
        err = [[x - b[0] for x, b in zip(values, bounds)], [b[1] - x for x, b in zip(values, bounds)]]
        ax.errorbar([d + 0.05 * i for d in depths], values, yerr=err, marker="o", capsize=3, label=label)
    engine = r.get("engine_metrics") or {}
    if engine.get("per_depth"):
        rows = engine["per_depth"]
        ax.plot([row["depth"] for row in rows], [row["measured"] for row in rows], "k^--", label="the engine measured")
    ax.set_ylim(0, 1.05)
    ax.set_xticks(depths)
    ax.set_xlabel("draft depth")
    ax.set_ylabel("acceptance (accepted / drafts reaching the depth)")
    return finish_figure(fig, ax, f"Acceptance the head allows, K = {r['k']}, T = {r['temperature']}", path)


def _length(r: dict, path: Path) -> Path:
    fig = Figure(figsize=(6.0, 4.2))
    ax = fig.add_subplot()
    for mode, label in RULES:
        ks = sorted(r["mean_acceptance_length"][mode], key=int)
        ax.plot([int(k) for k in ks], [r["mean_acceptance_length"][mode][k] for k in ks], marker="o", label=label)
    ax.set_xlabel("K (drafts per step)")
    ax.set_ylabel("mean acceptance length (tokens per target forward)")
    return finish_figure(fig, ax, "Expected tokens per step at each K", path)


def _entropy(r: dict, path: Path) -> Path:
    fig = Figure(figsize=(6.0, 4.2))
    ax = fig.add_subplot()
    for mode, label in RULES:
        bins = [b for b in r[f"{mode}_entropy_law"]["entropy_bins"] if b["mean_entropy"] is not None]
        ax.plot([b["mean_entropy"] for b in bins], [b["per_depth"][0]["rate"] for b in bins], marker="o", label=label)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("target entropy H(p_1) (nats), quantile bins")
    ax.set_ylabel("depth-1 acceptance")
    return finish_figure(fig, ax, "Acceptance against the target's entropy", path)
