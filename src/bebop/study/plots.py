"""The report's figures (matplotlib, a required dependency; no pyplot state: each function builds one Figure and saves a PNG).

Every figure has a title, labelled axes and a legend; numbers come from the caller, which reads
them from the saved results (bebop.study.report).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from bebop.stats.figures import finish_figure, save_figure
from bebop.study.entropy_law import LinearFit


def _integer_steps(ax) -> None:
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def plot_entropy_law(curves: Sequence[tuple[str, Sequence[float], Sequence[float], LinearFit | None]],
                     path: Path, title: str, xlabel: str = "mean target entropy of emitted tokens (nats)") -> Path:
    """curves: (label, entropies, accept lengths, fitted line); one marker series + line each."""
    fig = Figure(figsize=(6.4, 4.6))
    ax = fig.add_subplot()
    markers = "osD^vP*X"
    for i, (label, xs, ys, fit) in enumerate(curves):
        color = f"C{i}"
        ax.scatter(xs, ys, color=color, marker=markers[i % len(markers)], zorder=3)
        name = label if fit is None else f"{label}: slope {fit.slope:+.2f}/nat (r² {fit.r2:.2f})"
        if fit is not None:
            lo, hi = min(xs), max(xs)
            style = "--" if label.startswith("TO") else "-"  # TO curves of different heads often overlap
            ax.plot([lo, hi], [fit.predict(lo), fit.predict(hi)], style, color=color, label=name)
        else:
            ax.plot([], [], color=color, marker=markers[i % len(markers)], label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("mean acceptance length (tokens per target forward)")
    return finish_figure(fig, ax, title, path)


def plot_loss_table(losses: Sequence[str], rs: Sequence[float], to: Sequence[float], path: Path, title: str) -> Path:
    fig = Figure(figsize=(5.6, 4.0))
    ax = fig.add_subplot()
    xs = range(len(losses))
    width = 0.38
    ax.bar([x - width / 2 for x in xs], rs, width, label="rejection sampling (RS)")
    ax.bar([x + width / 2 for x in xs], to, width, label="target-only (TO)")
    for x, a, b in zip(xs, rs, to):
        ax.annotate(f"{a:.3f}", (x - width / 2, a), ha="center", va="bottom", fontsize=8)
        ax.annotate(f"{b:.3f}", (x + width / 2, b), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), [f"head: {loss}" for loss in losses])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("acceptance rate (accepted / drafted tokens)")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left")
    return save_figure(fig, path)


def plot_binned_acceptance(curves: Sequence[tuple[str, Sequence[float], Sequence[float], Sequence[float],
                                                   Sequence[float]]], path: Path, title: str) -> Path:
    """curves: (label, bin mean entropies, first-draft acceptance, interval low, interval high)."""
    fig = Figure(figsize=(6.4, 4.6))
    ax = fig.add_subplot()
    for label, xs, ys, low, high in curves:
        err = [[max(0.0, y - lo) for y, lo in zip(ys, low)], [max(0.0, hi - y) for y, hi in zip(ys, high)]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=label)
    ax.set_xscale("symlog", linthresh=0.01)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("target entropy at the draft's position (nats; quantile bins, symlog axis)")
    ax.set_ylabel("first-draft acceptance (95% Wilson interval)")
    return finish_figure(fig, ax, title, path)


def plot_acceptance_per_position(runs: Sequence[tuple[str, Sequence[int], Sequence[Sequence[float]]]],
                                 path: Path, title: str) -> Path:
    """runs: (name, steps, per-step acceptance per depth); one panel per run, one line per depth."""
    fig = Figure(figsize=(5.2 * max(1, len(runs)), 4.0))
    for i, (name, steps, per_pos) in enumerate(runs):
        ax = fig.add_subplot(1, max(1, len(runs)), i + 1)
        depth_count = max((len(p) for p in per_pos), default=0)
        for d in range(depth_count):
            ax.plot(steps, [p[d] if d < len(p) else float("nan") for p in per_pos], marker="o", label=f"depth {d + 1}")
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("RL step")
        _integer_steps(ax)
        ax.set_ylabel("acceptance at depth (accepted / drafts)")
        ax.set_title(f"{title}: {name}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_step_time(names: Sequence[str], rollout: Sequence[float], train: Sequence[float], step: Sequence[float],
                   path: Path, title: str) -> Path:
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    xs = range(len(names))
    width = 0.27
    ax.bar([x - width for x in xs], rollout, width, label="rollout_s (generation)")
    ax.bar(list(xs), train, width, label="train_s (GRPO update + sync)")
    ax.bar([x + width for x in xs], step, width, label="step_s (wall time per step)")
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("median seconds per RL step")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_rewards(runs: Sequence[tuple[str, Sequence[int], Sequence[float]]], path: Path, title: str) -> Path:
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    styles = {"off": "-", "to": ":", "rs": "--"}
    for i, (name, steps, rewards) in enumerate(runs):
        ax.plot(steps, rewards, styles.get(name.rsplit("-", 1)[-1], "-"), marker="o", color=f"C{i}", label=name)
    ax.set_xlabel("RL step")
    _integer_steps(ax)
    ax.set_ylabel("mean reward of the step's rollouts")
    return finish_figure(fig, ax, title, path)


def plot_online(runs: Sequence[tuple[str, Sequence[int], Sequence[float], Sequence[float]]], path: Path,
                title: str) -> Path:
    """runs: (online strategy, steps, first-draft acceptance, mean accept length); two panels, one line per run."""
    fig = Figure(figsize=(10.4, 4.0))
    for i, label in enumerate(("first-draft acceptance (accepted / drafts)", "mean acceptance length")):
        ax = fig.add_subplot(1, 2, i + 1)
        for j, (name, steps, first, length) in enumerate(runs):
            ax.plot(steps, first if i == 0 else length, marker="o", color=f"C{j}", label=name)
        ax.set_xlabel("RL step")
        _integer_steps(ax)
        ax.set_ylabel(label)
        ax.set_title(title if i == 0 else "", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, title="online MTP")
    return save_figure(fig, path)


def plot_loss_intervals(losses: Sequence[str], cells: Mapping[str, Sequence[Sequence[float]]], path: Path,
                        title: str) -> Path:
    """cells: rule label -> per loss [mean, low, high] acceptance (a 95% interval over seeds); bars
    with their intervals, one group per loss."""
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(cells))
    for i, (label, values) in enumerate(cells.items()):
        xs = [j + (i - (len(cells) - 1) / 2) * width for j in range(len(losses))]
        means = [v[0] for v in values]
        err = [[v[0] - v[1] for v in values], [v[2] - v[0] for v in values]]
        ax.bar(xs, means, width, yerr=err, capsize=4, label=label, color=f"C{i}")
    ax.set_xticks(list(range(len(losses))), list(losses))
    ax.set_ylabel("acceptance rate (mean over seeds, 95% interval)")
    ax.set_ylim(0, 1)
    return finish_figure(fig, ax, title, path)


def plot_curves(curves: Sequence[tuple[str, Sequence[int], Sequence[float]]], path: Path, title: str) -> Path:
    """curves: (label "LOSS sSEED", steps, values): one line per head, one colour per loss."""
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    colours: dict[str, str] = {}
    for label, steps, values in curves:
        loss = label.split()[0]
        first = loss not in colours
        colours.setdefault(loss, f"C{len(colours)}")
        ax.plot(steps, values, color=colours[loss], alpha=0.7, label=loss if first else None)
    ax.set_xlabel("training step")
    ax.set_ylabel("held-out RS expected acceptance")
    _integer_steps(ax)
    return finish_figure(fig, ax, title, path)
