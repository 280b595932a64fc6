"""diagnosis.json, diagnosis.md and the figures of `bebop mtp diagnose` (each written atomically)."""

from __future__ import annotations

from pathlib import Path

from bebop.fileio import atomic_write_json, atomic_write_text
from bebop.mtp.diagnose_plots import write_plots


def write_diagnosis(report: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "diagnosis.json", out / "diagnosis.md"]
    atomic_write_json(paths[0], report)
    atomic_write_text(paths[1], render(report))
    return paths + write_plots(report, out)


def _num(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _interval(value: float | None, bounds: list) -> str:
    low, high = bounds
    return _num(value) if low is None else f"{_num(value)} [{_num(low)}, {_num(high)}]"


def render(r: dict) -> str:
    lines = [f"# Draft head diagnosis: {r.get('model', '')}", "",
             f"{r.get('rollouts', '?')} rollouts from `{r.get('source', '?')}`, {r['positions']} drafting positions; "
             f"T = {r['temperature']}, top-k {r['top_k']}, top-p {r['top_p']}; K = {r['k']}. Expected acceptance "
             "along the head's own draft chains, weighted as a speculative run's steps fall (95% intervals over "
             "rollouts).", "",
             "| depth | RS acceptance | TO acceptance | RS per position | TO per position |", "|---|---|---|---|---|"]
    for d in range(r["k"]):
        lines.append(f"| {d + 1} | {_interval(r['rs_acceptance_per_depth'][d], r['rs_acceptance_intervals'][d])} | "
                     f"{_interval(r['to_acceptance_per_depth'][d], r['to_acceptance_intervals'][d])} | "
                     f"{_num(r['per_position_acceptance']['rs'][d])} | {_num(r['per_position_acceptance']['to'][d])} |")
    lines += ["", "Mean acceptance length (tokens per target forward, 1 + accepted / drafts) at each K:", "",
              "| K | RS | TO |", "|---|---|---|"]
    mal, intervals = r["mean_acceptance_length"], r["mean_acceptance_length_intervals"]
    for kk in mal["rs"]:
        lines.append(f"| {kk} | {_interval(mal['rs'][kk], intervals['rs'][kk])} | "
                     f"{_interval(mal['to'][kk], intervals['to'][kk])} |")
    lines += ["", f"RS beats TO (TV(p, q) < 1 - p(argmax q)) at {100 * r['rs_beats_to_share']:.1f}% of positions; "
              f"mean target entropy {r['mean_target_entropy']:.3f} nats.", ""]
    for mode in ("rs", "to"):
        slope = r[f"{mode}_entropy_law"]["first_draft_slope"]
        if slope:
            lines.append(f"- {mode.upper()} depth-1 acceptance vs target entropy: {slope['slope']:+.3f} per nat "
                         f"[{slope['low']:+.3f}, {slope['high']:+.3f}] (intercept {slope['intercept']:.3f}, "
                         f"{slope['n']} positions)")
    lines += ["", "Draft diagnostics per depth along the RS chains (docs/method.md; alpha = sum min(p, q)):", "",
              "| depth | KL(p‖q) | H(q) - H(p) | alpha | alpha, p > q | alpha, q ≥ p |", "|---|---|---|---|---|---|"]
    for row in r["draft_diagnostics"]:
        lines.append(f"| {row['depth']} | {_num(row['kl'])} | {_num(row['entropy_gap'])} | {_num(row['alpha'])} | "
                     f"{_num(row['alpha_p_gt_q'])} | {_num(row['alpha_q_gt_p'])} |")
    if r.get("change_from_baseline"):
        lines += _change_lines(r["change_from_baseline"], r.get("baseline"))
    if r.get("engine_metrics"):
        lines += _engine_lines(r["engine_metrics"])
    return "\n".join(lines) + "\n"


def _change_lines(c: dict, baseline: str | None) -> list[str]:
    lines = ["", f"Change from the baseline `{baseline}` (mean target entropy {c['entropy_base']:.3f} -> "
                 f"{c['entropy_new']:.3f} nats), depth-1 acceptance per position:", "",
             "| rule | baseline | now | change | entropy part | mismatch part | slope per nat |", "|---|---|---|---|---|---|---|"]
    for mode in ("rs", "to"):
        m = c[mode]
        lines.append(f"| {mode.upper()} | {m['acceptance_base']:.3f} | {m['acceptance_new']:.3f} | {m['change']:+.3f} | "
                     f"{m['entropy_part']:+.3f} | {m['mismatch_part']:+.3f} | {m['slope']:+.3f} "
                     f"[{m['slope_interval'][0]:+.3f}, {m['slope_interval'][1]:+.3f}] |")
    return lines


def _engine_lines(e: dict) -> list[str]:
    if e["engine"] == "sglang":
        flag = " **below the bound**" if e["below_bound"] else ""
        return ["", f"SGLang measured a mean acceptance length of {e['measured_mean_acceptance_length']:.3f} at K = "
                    f"{e['k']}; the head allows {_num(e['predicted_rs'])} under RS.{flag}"]
    lines = ["", f"The engine's counters (vLLM): mean acceptance length {_num(e['measured_mean_acceptance_length'])}.", "",
             "| depth | measured [95%] | RS allows | TO allows | below the bound |", "|---|---|---|---|---|"]
    for row in e["per_depth"]:
        lines.append(f"| {row['depth']} | {_interval(row['measured'], [row['low'], row['high']])} | "
                     f"{_num(row['predicted_rs'])} | {_num(row['predicted_to'])} | {'yes' if row['below_bound'] else ''} |")
    if e["flagged"]:
        lines += ["", "The engine accepts less than the head allows: it drafts greedily (TO), or drafts with a head "
                      "other than this one, or its sampling settings differ from the ones diagnosed."]
    return lines
