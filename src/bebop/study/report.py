"""The demo report, rebuilt from saved results alone (nothing is rerun).

    bebop report runs/demo          # -> runs/demo/report.md and runs/demo/plots/*.png

Reads the files of bebop.study.layout: demo_config.json, results/*.json and the RL runs'
metrics.jsonl. A stage with no results yet gets a "not run yet" line instead of a section's
numbers. Every number in the tables is a value from those files, rounded for display, or a named
statistic of them (a median, a mean, a fitted slope), and each table says which file and how
it was measured.
"""

from __future__ import annotations

from pathlib import Path

from bebop.fileio import atomic_write_text
from bebop.study.entropy_law import PAPER_SLOPES, LinearFit, fit_line
from bebop.study.layout import DemoLayout
from bebop.study.report_format import f3, missing, per_pos, slope_cell, table
from bebop.study.report_rl import section_drafters, section_online, section_rl, section_rl_entropy, write_rl_plots
from bebop.study.results import MODE_NAMES, TV_LOSSES, DemoResults, load_results

__all__ = ["load_results", "render_markdown", "write_report"]


# ---- statistics of the saved results ----------------------------------------------------------

def sweep_points(res: DemoResults, loss: str, mode: str) -> list[dict]:
    rows = [r for r in res.sweeps.get(loss, {}).get("rows", []) if r["mode"] == mode]
    return sorted(rows, key=lambda r: r["temperature"])


def entropy_fits(res: DemoResults) -> list[tuple[str, str, list[dict], LinearFit | None]]:
    """(mode, loss, points, fit of mean acceptance length on mean entropy) for every curve."""
    out = []
    for loss in res.losses:
        for mode in ("to", "rs"):
            pts = sweep_points(res, loss, mode)
            if not pts:
                continue
            xs = [p["mean_entropy"] for p in pts]
            fit = fit_line(xs, [p["mean_acceptance_length"] for p in pts]) if len(set(xs)) >= 2 else None
            out.append((mode, loss, pts, fit))
    return out


def paper_slope(mode: str, loss: str) -> float | None:
    if mode == "to":
        return PAPER_SLOPES["to"]
    if loss == "ce":
        return PAPER_SLOPES["rs+ce"]
    if loss in TV_LOSSES:
        return PAPER_SLOPES["rs+tv"]
    return None


# ---- markdown ----------------------------------------------------------------------------------

def section_policy(res: DemoResults) -> list[str]:
    lines = ["## 1. Policy", ""]
    if res.policy is None:
        return lines + missing("results/policy.json")
    p = res.policy
    lines += [f"The {p['task']} policy in `{p['model_dir']}` was **{p['source']}**"
              + (f": SFT for {p['sft_steps']} steps, final training loss {f3(p['sft_final_loss'])} "
                 f"(mean of the last 20 steps), {p['num_parameters']:,} parameters" if p.get("sft_steps") else "")
              + ". Source: `results/policy.json`.", ""]
    return lines


def section_loss_table(res: DemoResults) -> list[str]:
    t = float(res.config.get("table_temperature", 1.0))
    lines = [f"## 2. Loss table (T={t:g})", ""]
    rows, sources = [], []
    for loss in res.losses:
        by_mode = {p["mode"]: p for p in res.sweeps.get(loss, {}).get("rows", []) if p["temperature"] == t}
        if not {"rs", "to"} <= set(by_mode):
            continue
        rs, to = by_mode["rs"], by_mode["to"]
        head = res.heads.get(loss, {})
        rows.append([loss, f3(rs["acceptance_rate"]), f3(to["acceptance_rate"]), f3(rs["mean_acceptance_length"]),
                     f3(to["mean_acceptance_length"]), per_pos(rs["acceptance_rate_per_position"]),
                     f3(rs["mean_entropy"]), f3(head.get("final_loss"))])
        sources.append(loss)
    if not rows:
        return lines + missing("results/sweep-<loss>.json")
    meta = res.sweeps[sources[0]]["meta"]
    hcfg = res.heads.get(sources[0], {}).get("config", {})
    train = (f"Heads trained {hcfg['steps']} steps over {hcfg['depths']} depths on {hcfg['num_samples']} "
             f"self-distilled samples, same init, data and seed (`results/head-<loss>.json`). ") if hcfg else ""
    lines += [train + f"Acceptance measured by speculative generation at K={meta['k']}, T={t:g} on "
              f"{meta['n']} {meta['split']} prompts (seed {meta['seed']}, at most {meta['max_new_tokens']} new tokens); "
              "acceptance rate = accepted / drafted tokens, mean accept length = 1 + accepted / drafts. "
              "Source: `results/sweep-<loss>.json`, rows at this temperature. One head per loss: the "
              "difference between heads is within seed-to-seed spread unless `bebop mtp study` "
              "(heads trained to convergence, exact expected acceptance, paired 95% intervals over 5 seeds; "
              "docs/results/loss-study.md, its tables docs/results/loss-pick-converged.md and the entropy law "
              "across RL steps docs/results/rl-entropy-law.md) says otherwise.", ""]
    lines += table(["head loss", "RS acceptance", "TO acceptance", "RS mean accept length", "TO mean accept length",
                     "RS per position", "mean entropy (nats)", "final train loss"], rows)
    return lines + ["", "![loss table](plots/loss_table.png)", ""]


def section_sweep(res: DemoResults) -> list[str]:
    lines = ["## 3. Temperature sweep", ""]
    rows = []
    for loss in res.losses:
        for mode in ("to", "rs"):
            for p in sweep_points(res, loss, mode):
                rows.append([loss, MODE_NAMES[mode], f"{p['temperature']:g}", f3(p["mean_entropy"]),
                             f3(p["acceptance_rate"]), f3(p["mean_acceptance_length"]),
                             per_pos(p["acceptance_rate_per_position"]), f3(p["pass_rate"])])
    if not rows:
        return lines + missing("results/sweep-<loss>.json")
    meta = next(iter(res.sweeps.values()))["meta"]
    lines += [f"Each row: speculative generation on the same {meta['n']} {meta['split']} prompts with the same "
              f"generator seed ({meta['seed']}), K={meta['k']}; mean entropy is the target's entropy at that "
              "temperature averaged over emitted tokens; pass rate is the task reward of those generations. "
              "Source: `results/sweep-<loss>.json`.", ""]
    return lines + table(["head", "mode", "T", "mean entropy (nats)", "acceptance rate", "mean accept length",
                           "per position", "pass rate"], rows) + [""]


def section_entropy_law(res: DemoResults) -> list[str]:
    lines = ["## 4. Acceptance against entropy", ""]
    fits = entropy_fits(res)
    if not fits:
        return lines + missing("results/sweep-<loss>.json")
    rows = []
    for mode, loss, pts, fit in fits:
        paper = paper_slope(mode, loss)
        rows.append([f"{MODE_NAMES[mode]} + {loss}", f3(fit.slope if fit else None),
                     f3(fit.intercept if fit else None), f3(fit.r2 if fit else None), str(len(pts)),
                     f"{paper:+.2f}" if paper is not None else "n/a"])
    lines += ["Least-squares line mean accept length = intercept + slope × mean entropy over the temperature "
              "sweep's points (one per temperature, from `results/sweep-<loss>.json`). The paper's slopes: "
              "about -1.68 for TO and for RS with a CE head, about -0.06 for RS with a TV head.", ""]
    return lines + table(["curve", "slope (per nat)", "intercept", "r²", "points", "paper slope"], rows) + \
        ["", "![acceptance against entropy](plots/entropy_law.png)", ""]


def per_token_curves(res: DemoResults) -> list[tuple[str, str, dict]]:
    """(mode, loss, sweep row at the table temperature) for every curve whose row has entropy bins."""
    t = float(res.config.get("table_temperature", 1.0))
    return [(mode, loss, p) for loss in res.losses for mode in ("to", "rs") for p in sweep_points(res, loss, mode)
            if p["temperature"] == t and p.get("entropy_bins")]


def section_entropy_per_token(res: DemoResults) -> list[str]:
    lines = ["## 4b. The entropy law per token", ""]
    curves = per_token_curves(res)
    if not curves:
        return lines + missing("entropy bins in results/sweep-<loss>.json (a sweep run with entropy_bins > 0)")
    rows, slopes = [], {}
    for mode, loss, p in curves:
        s = p.get("first_draft_slope")
        slopes[(mode, loss)] = s
        rows.append([f"{MODE_NAMES[mode]} + {loss}", f"{p['temperature']:g}",
                     slope_cell(s["slope"], s["low"], s["high"]) if s else "n/a", str(s["n"]) if s else "0",
                     ", ".join(f3(b["per_depth"][0]["rate"]) for b in p["entropy_bins"])])
    lines += ["Every verified first draft at the loss table's temperature, binned by the target's entropy at its "
              "position (quantile bins). Slope: least squares of the 0/1 acceptance on entropy over the drafts "
              "(acceptance probability per nat), with a 95% bootstrap interval; the paper's slopes are in accept "
              "length per nat over RL steps, so compare ratios between curves, not raw numbers.", ""]
    lines += table(["rule + head", "T", "first-draft slope per nat [95% interval]", "drafts",
                     "first-draft acceptance by entropy bin (low to high)"], rows) + [""]
    lines += _slope_ratio_lines(slopes)
    return lines + ["![first-draft acceptance by entropy bin](plots/entropy_bins.png)", ""]


def _slope_ratio_lines(slopes: dict) -> list[str]:
    """The method's claim in this data: RS with each head flattens the law relative to TO."""
    out = []
    for (mode, loss), s in slopes.items():
        to = slopes.get(("to", loss))
        if mode == "rs" and s and to and to["slope"] < 0:
            out.append(f"- RS + {loss}: slope {s['slope']:+.3f} is {s['slope'] / to['slope']:.2f} of TO's "
                       f"{to['slope']:+.3f} with the same head (the paper: about 1 for a ce head, about 0.04 for tv).")
    return out + [""] if out else []


def section_diagnostics(res: DemoResults) -> list[str]:
    lines = ["## 4c. Draft against target, per depth (the paper's Fig. 11)", ""]
    heads = [(loss, res.sweeps[loss]["diagnostics"]) for loss in res.losses if res.sweeps.get(loss, {}).get("diagnostics")]
    if not heads:
        return lines + missing("diagnostics in results/sweep-<loss>.json")
    t = float(res.config.get("table_temperature", 1.0))
    rows = [[loss, str(r["depth"]), f3(r["kl"]), f"{r['entropy_gap']:+.3f}", f3(r["alpha"]), f3(r["alpha_p_gt_q"]),
             f3(r["alpha_q_gt_p"]), str(r["chains"])] for loss, diag in heads for r in diag]
    lines += [f"Teacher-forced chains over the policy's own completions of {res.config.get('eval_n')} test prompts at "
              f"T={t:g}: p the trunk's distribution, q the head's. alpha = sum min(p, q) = 1 - TV is the RS acceptance "
              "probability; it splits into the mass of tokens the head under-proposes (p > q) and over-proposes "
              "(q >= p). The paper: a ce head spreads q (positive entropy gap), a tv head concentrates it.", ""]
    return lines + table(["draft head", "depth", "KL(p‖q)", "H(q) - H(p)", "alpha", "alpha p>q", "alpha q>=p",
                           "chains"], rows) + [""]


def section_stage_times(res: DemoResults) -> list[str]:
    """Wall seconds of each stage as its results file recorded them (a resumed stage: its last part)."""
    rows = []
    if res.policy is not None and "seconds" in res.policy:
        rows.append(["policy", f"{res.policy['seconds']:.1f}", "SFT (0 when reused)", "`results/policy.json`"])
    for i, loss in enumerate(res.losses):
        if "seconds" in res.heads.get(loss, {}):
            what = "train_mtp, incl. self-distilling the shared data" if i == 0 else "train_mtp"
            rows.append([f"head {loss}", f"{res.heads[loss]['seconds']:.1f}", what, f"`results/head-{loss}.json`"])
    for loss in res.losses:
        if "seconds" in res.sweeps.get(loss, {}).get("meta", {}):
            rows.append([f"sweep {loss}", f"{res.sweeps[loss]['meta']['seconds']:.1f}", "evaluate_mtp, every point",
                         f"`results/sweep-{loss}.json`"])
    for name, run in res.rl.items():
        if run.rows:
            rows.append([f"RL {name}", f"{sum(r['step_s'] for r in run.rows):.1f}",
                         "sum of step_s (no setup or checkpoints)", f"`{run.log}`"])
    if not rows:
        return []
    return ["## 6. Where the time went", "",
            "Seconds of the run that completed each stage (a stage resumed after a kill counts only its last "
            "part).", ""] + table(["stage", "seconds", "what was timed", "source"], rows) + [""]


def render_markdown(res: DemoResults) -> str:
    cfg = res.config
    head = ["# bebop demo report", ""]
    if cfg.get("name") == "miniature":
        head += ["**Miniature configuration**: a tiny model and a few steps per stage, to exercise the pipeline. "
                 "Its numbers say nothing about the method; run `bebop demo` for the real study.", ""]
    if cfg:
        head += [f"Task `{cfg.get('task')}`, seed {cfg.get('seed')}; heads {', '.join(cfg.get('losses', []))}; "
                 f"K={cfg.get('k')}; temperatures {', '.join(f'{t:g}' for t in cfg.get('temperatures', []))}; "
                 f"RL {cfg.get('rl_steps')} steps per run. The full configuration: `demo_config.json`.", ""]
    head += ["Rebuild this page from the results saved beside it (nothing is rerun): `bebop report DIR`.", ""]
    body = section_policy(res) + section_loss_table(res) + section_sweep(res) + section_entropy_law(res) + \
        section_entropy_per_token(res) + section_diagnostics(res) + section_rl(res) + section_drafters(res) + \
        section_online(res) + \
        section_rl_entropy(res) + section_stage_times(res)
    return "\n".join(head + body).rstrip() + "\n"


# ---- figures -----------------------------------------------------------------------------------

def write_plots(res: DemoResults, plots: Path) -> list[Path]:
    from bebop.study import plots as P

    out = []
    t = float(res.config.get("table_temperature", 1.0))
    cells = [(loss, {p["mode"]: p for p in res.sweeps[loss]["rows"] if p["temperature"] == t})
             for loss in res.losses if loss in res.sweeps]
    cells = [(loss, m) for loss, m in cells if {"rs", "to"} <= set(m)]
    if cells:
        out.append(P.plot_loss_table([x for x, _ in cells], [m["rs"]["acceptance_rate"] for _, m in cells],
                                     [m["to"]["acceptance_rate"] for _, m in cells], plots / "loss_table.png",
                                     f"Acceptance per head loss (T={t:g})"))
    fits = entropy_fits(res)
    if fits:
        curves = [(f"{MODE_NAMES[mode]} + {loss}", [p["mean_entropy"] for p in pts],
                   [p["mean_acceptance_length"] for p in pts], fit) for mode, loss, pts, fit in fits]
        out.append(P.plot_entropy_law(curves, plots / "entropy_law.png",
                                      "Mean acceptance length against target entropy"))
    binned = per_token_curves(res)
    if binned:
        bin_curves = []
        for mode, loss, p in binned:
            filled = [b for b in p["entropy_bins"] if b["per_depth"][0]["reached"]]  # (bin, first-draft stats)
            first = [b["per_depth"][0] for b in filled]
            bin_curves.append((f"{MODE_NAMES[mode]} + {loss}", [b["mean_entropy"] for b in filled],
                               [d["rate"] for d in first], [d["low"] for d in first], [d["high"] for d in first]))
        out.append(P.plot_binned_acceptance(bin_curves, plots / "entropy_bins.png",
                                            "First-draft acceptance against the target's entropy, per token"))
    return out + write_rl_plots(res, plots)


def write_report(root: str | Path, *, plots: bool = True) -> Path:
    """Write ROOT/report.md (and ROOT/plots/*.png) from ROOT's saved results; -> the report's path."""
    res = load_results(root)
    layout = DemoLayout(res.root)
    text = render_markdown(res)
    if plots:
        write_plots(res, layout.plots)
    atomic_write_text(layout.report, text)
    return layout.report
