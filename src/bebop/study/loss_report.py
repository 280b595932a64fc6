"""The loss study's report from its results alone (bebop.study.loss_study): OUT/loss_table.md with a table per
(temperature, head size) cell, and per cell a plot of the held-out curves and one of the acceptance intervals.

    write_cells_report(Path("OUT/loss_table.json"))   # also `bebop report OUT/loss_table.json`
"""

from __future__ import annotations

import json
from pathlib import Path

from bebop.fileio import atomic_write_text

COLUMNS = (("exact_rs_rate", "RS exact"), ("exact_to_rate", "TO exact"), ("sampled_rs_rate", "RS sampled"),
           ("sampled_to_rate", "TO sampled"))


def cell_name(temperature: float, size: str) -> str:
    """A cell's name in head directories and plot files: T1-full, T0.7-half."""
    return f"T{temperature:g}-{size}"


def points(cell: list[float] | None, signed: bool = False) -> str:
    """[mean, low, high] of a rate -> '55.3% [51.2, 59.3]' (a difference: '+0.1 [-7.5, +7.7]' points)."""
    if cell is None:
        return "n/a"
    mean, low, high = (100 * x for x in cell)
    if signed:
        return f"{mean:+.1f}" if low == high else f"{mean:+.1f} [{low:+.1f}, {high:+.1f}]"
    return f"{mean:.1f}%" if low == high else f"{mean:.1f}% [{low:.1f}, {high:.1f}]"


def cell_table(cell: dict) -> list[str]:
    head = "| loss | " + " | ".join(f"{label} | vs ce" for _, label in COLUMNS) + " | best step |"
    lines = [head, "|" + "---|" * (2 * len(COLUMNS) + 2)]
    for row in cell["rows"]:
        parts = [f"{points(row.get(m))} | {points(row.get(f'{m}_vs_ce'), True) if row['loss'] != 'ce' else ''}"
                 for m, _ in COLUMNS]
        best = row.get("best_step")
        lines.append(f"| {row['loss']} | " + " | ".join(parts) + (f" | {best[0]:.0f} |" if best else " | n/a |"))
    eq = cell.get("equal_compute")
    if eq:
        text = ", ".join(f"{loss} {points(v['heldout'])}" + (f" ({points(v['vs_ce'], True)} vs ce)" if "vs_ce" in v
                                                            else "") for loss, v in eq["losses"].items())
        lines += ["", f"Equal compute (held-out RS expected acceptance at step {eq['step']}, the last step every "
                      f"head of the cell reached): {text}."]
    return lines


def render_cells(data: dict, stem: str = "loss_table") -> str:
    """The markdown of a study's results; `stem` names the per-cell plots beside it (STEM-CELL-curves.png)."""
    meta = data["meta"]
    lines = [f"# Loss study: {meta['task']}, K={meta['k']}", "",
             f"Losses {', '.join(meta['losses'])}; seeds {', '.join(map(str, meta['seeds']))} (a seed sets the head's "
             f"initialisation, its {meta['num_samples']} self-distilled samples and their order); step cap "
             f"{meta['steps']} for every loss, the best head on {meta['held_out']} held-out samples kept (measured "
             f"every {meta['eval_every']} steps, patience {meta['patience']})"
             + (f", non-ce heads trained with ce for the first {meta['ce_warmup']:.0%} of the cap" if meta['ce_warmup']
                else "") + f". Measured on the policy's own samples of {meta['n_eval']} test prompts at the cell's "
             "temperature: **exact** = expected acceptance along the head's draft chains (bebop.mtp.heldout), "
             "**sampled** = speculative generation (accepted / drafted tokens). Cells: mean over seeds [95% "
             "t-interval]; 'vs ce' = the paired difference to the ce head of the same seed, in points.", ""]
    for cell in data["cells"]:
        entropy = f", target entropy {cell['mean_entropy']:.2f} nats" if cell.get("mean_entropy") is not None else ""
        lines += [f"## T = {cell['temperature']:g}, head {cell['head_size']} ({cell['test_positions']} test positions"
                  f"{entropy})", ""]
        lines += cell_table(cell) + ["", f"![curves]({stem}-{_slug(cell)}-curves.png)", ""]
    lines += [f"Command: `{meta['command']}`", ""]
    return "\n".join(lines)


def _slug(cell: dict) -> str:
    return cell_name(cell["temperature"], cell["head_size"])


def write_cells_report(results: Path, *, plots: bool = True) -> Path:
    from bebop.study.plots import plot_curves

    data = json.loads(results.read_text())  # read_study (bebop report) or run_loss_study checked it
    md = results.with_suffix(".md")
    atomic_write_text(md, render_cells(data, results.stem))
    if plots:
        for cell in data["cells"]:
            runs = [r for r in data["runs"] if r["temperature"] == cell["temperature"]
                    and r["head_size"] == cell["head_size"]]
            curves = [(f"{r['loss']} s{r['seed']}", [p[0] for p in r["curve"]], [p[1] for p in r["curve"]])
                      for r in runs if r["curve"]]
            plot_curves(curves, results.parent / f"{results.stem}-{_slug(cell)}-curves.png",
                        f"Held-out RS expected acceptance: T={cell['temperature']:g}, head {cell['head_size']}")
    return md
