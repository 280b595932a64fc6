"""The report's GRPO sections and their figures, from the RL runs' metrics.jsonl alone.

    5   step time, speedup, acceptance and reward of every run; reward with and without speculation
    5b  online MTP strategies: the same run with the head frozen (none) and updated online
    5c  acceptance against the policy's entropy across RL steps (the paper's own axis)
    5d  drafters: the head's drafts, the rollouts' own text (suffix) and both, side by side
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bebop.study.entropy_law import LinearFit, slope_interval
from bebop.study.layout import LONG_TAG
from bebop.study.report_format import f2, f3, missing, per_pos, slope_cell, table
from bebop.study.results import BASELINE_RUN, DemoResults, RLRun, base_run, baseline_of, is_long, online_strategy


@dataclass(frozen=True)
class StepTimes:
    timed_steps: list[int]  # the steps after warmup that the medians are over
    step_s: float
    rollout_s: float
    train_s: float
    wait_s: float


def step_times(run: RLRun, warmup: int) -> StepTimes | None:
    rows = [r for r in run.rows if r["step"] > warmup] or run.rows
    if not rows:
        return None
    med = lambda key: statistics.median(r.get(key, 0.0) for r in rows)  # noqa: E731
    return StepTimes([r["step"] for r in rows], med("step_s"), med("rollout_s"), med("train_s"), med("wait_s"))


def rollout_share(run: RLRun, st: StepTimes) -> float | None:
    """rollout_s / step_s of a sync run (None for async, whose rollouts overlap the update)."""
    return st.rollout_s / st.step_s if (run.config or {}).get("mode", "sync") == "sync" and st.step_s > 0 else None


def response_lengths(run: RLRun) -> str:
    """The median of the steps' median response lengths, and the longest response, in tokens ("-" if not logged)."""
    medians = [r["response_len_p50"] for r in run.rows if "response_len_p50" in r]
    longest = [r["response_len_max"] for r in run.rows if "response_len_max" in r]
    return f"{statistics.median(medians):.0f} / {max(longest)}" if medians and longest else "-"


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """The mean and its standard error (0 for a single value)."""
    m = sum(values) / len(values)
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return m, se


def section_rl(res: DemoResults) -> list[str]:
    lines = ["## 5. GRPO: step time, speedup, acceptance, reward", ""]
    if not res.rl:
        return lines + missing("rl/<mode>-<spec>/metrics.jsonl")
    w = res.warmup
    times = {name: step_times(run, w) for name, run in res.rl.items()}
    configs = [run.config for run in res.rl.values()]
    any_cfg = next((c for c in configs if c and c.get("spec", "off") != "off"), configs[0])  # K of a drafting run
    rows = []
    for name, run in res.rl.items():
        st, base = times[name], times.get(baseline_of(name))
        if st is None:
            continue
        speedup = base.step_s / st.step_s if base is not None and st.step_s > 0 else None
        reward = sum(r["reward"] for r in run.rows) / len(run.rows)
        accept = sum(r["mean_acceptance_length"] for r in run.rows) / len(run.rows)
        rows.append([name, f"{len(run.rows)}" + ("" if run.finished else " (unfinished)"),
                     f"{st.timed_steps[0]}-{st.timed_steps[-1]}", f3(st.step_s), f3(st.rollout_s), f3(st.wait_s),
                     f3(st.train_s), f2(rollout_share(run, st)), f2(speedup), f3(reward), f3(accept),
                     response_lengths(run)])
    if any_cfg:
        lines += [f"Runs from the `{Path(any_cfg.get('model', '?')).name}` head's model: {any_cfg.get('batch_prompts')} "
                  f"prompts × {any_cfg.get('group_size')} samples per step, at most {any_cfg.get('max_new_tokens')} new "
                  f"tokens, T={any_cfg.get('temperature')}, K={any_cfg.get('k')} when speculating, seed "
                  f"{any_cfg.get('seed')} for every run.", ""]
    long_cfg = next((run.config for name, run in res.rl.items() if is_long(name) and run.config), None)
    if long_cfg:
        lines += [f"The `{LONG_TAG.lstrip('-')}` runs are the long-response configuration: the same runs on prompts "
                  f"of difficulty {long_cfg.get('difficulty')}, whose answers are longer; their speedup is over "
                  f"{BASELINE_RUN}{LONG_TAG}.", ""]
    lines += [f"Times are medians over the steps in the 'timed steps' column (after {w} warmup step(s)) of each "
              "run's `rl/<run>/metrics.jsonl`: rollout_s is generation time, wait_s the time the trainer waited "
              "for a batch (async: less than rollout_s when generation overlaps training), train_s the update "
              "and weight sync, step_s the wall time per step. Rollout share = rollout_s / step_s (sync runs: "
              "the most a faster rollout can take off the step). Speedup = median step_s of the configuration's "
              f"{BASELINE_RUN} / median step_s of the run. Reward and mean accept length are means over all logged "
              "steps; response lengths in tokens, the median of each step's median, and the longest.", ""]
    lines += table(["run", "steps", "timed steps", "step_s", "rollout_s", "wait_s", "train_s", "rollout share",
                     f"speedup vs {BASELINE_RUN}", "mean reward", "mean accept length", "response p50 / max"], rows)
    lines += ["", "![RL step time](plots/rl_step_time.png)", ""]
    lines += section_lossless(res)
    if any(r.get("acceptance_rate_per_position") for run in res.rl.values() for r in run.rows):
        lines += ["Per-position acceptance of every speculative run at each step (`acceptance_rate_per_position` "
                  "in its metrics.jsonl: accepted at depth d / drafts).", "",
                  "![per-position acceptance over RL steps](plots/rl_acceptance.png)", ""]
    return lines


def section_lossless(res: DemoResults) -> list[str]:
    """Reward with and without speculation, per mode: lossless decoding means they agree."""
    rows = []
    for mode, tag in (("sync", ""), ("async", ""), ("sync", LONG_TAG)):
        off = res.rl.get(f"{mode}-off{tag}")
        for spec in ("rs", "to"):
            on = res.rl.get(f"{mode}-{spec}{tag}")
            if off is None or on is None or not off.rows or not on.rows:
                continue
            m_off, se_off = mean_se([r["reward"] for r in off.rows])
            m_on, se_on = mean_se([r["reward"] for r in on.rows])
            diff, se = m_on - m_off, math.hypot(se_off, se_on)
            agree = abs(diff) <= 2 * se + 1e-12
            rows.append([mode + tag, spec, f3(m_off), f3(m_on), f"{diff:+.3f}", f3(se), "yes" if agree else "no"])
    lines = ["### Reward with and without speculation", ""]
    if not rows:
        return lines + missing("a spec-off and a speculative run of the same mode")
    lines += ["Mean reward per step over all logged steps, and the standard error of the difference (per-step "
              "means treated as independent). Speculative decoding is lossless, so the curves should agree within "
              "noise; same seeds, but not token for token (the draft consumes random numbers).", ""]
    return lines + table(["mode", "spec", "reward (spec off)", "reward (spec on)", "difference", "s.e.", "within 2 s.e."],
                          rows) + ["", "![reward curves](plots/rl_reward.png)", ""]


# ---- 5d. drafters ------------------------------------------------------------------------------------

def drafter_of(run: RLRun) -> str:
    return (run.config or {}).get("drafter", "mtp")


def by_source(run: RLRun) -> dict[str, tuple[int, float]]:
    """Drafts and mean accept length per source over every logged step (metrics' drafts_by_source)."""
    drafts: dict[str, int] = {}
    accepted: dict[str, float] = {}
    for row in run.rows:
        for source, got in (row.get("drafts_by_source") or {}).items():
            drafts[source] = drafts.get(source, 0) + got["num_drafts"]
            accepted[source] = accepted.get(source, 0.0) + got["num_drafts"] * (got["mean_acceptance_length"] - 1)
    return {s: (n, 1 + accepted[s] / n if n else 1.0) for s, n in sorted(drafts.items())}


def section_drafters(res: DemoResults) -> list[str]:
    """The sync rs runs that differ only in their drafter, beside the run without speculation."""
    runs = [run for run in res.rl.values() if base_run(run.name) == run.name and run.name.startswith("sync-rs")
            and online_strategy(run.name) == "none" and not is_long(run.name)]
    lines = ["### Drafters: the head, the rollouts' own text, both", ""]
    if len({drafter_of(run) for run in runs}) < 2:
        return lines + missing("sync rs runs with --drafter mtp and suffix or both (DemoConfig.rl_drafters)")
    off = res.rl.get("sync-off")
    base = step_times(off, res.warmup) if off is not None else None
    rows = []
    for run in sorted(runs, key=lambda r: ("mtp", "both", "suffix").index(drafter_of(r)) if drafter_of(r) in
                      ("mtp", "both", "suffix") else 9):
        st = step_times(run, res.warmup)
        if st is None:
            continue
        accept = sum(r["mean_acceptance_length"] for r in run.rows) / len(run.rows)
        sources = ", ".join(f"{s} {n} ({a:.2f})" for s, (n, a) in by_source(run).items()) or "-"
        rows.append([drafter_of(run), run.name, f3(st.rollout_s),
                     f2(base.rollout_s / st.rollout_s) if base is not None and st.rollout_s > 0 else "-",
                     f2(base.step_s / st.step_s) if base is not None and st.step_s > 0 else "-", f3(accept), sources])
    lines += ["The same GRPO run with each drafter (`--drafter`): the head's drafts, drafts from the rollouts' own "
              "text (the group's siblings, earlier responses to the same prompt, the prompt: no head forward) and, "
              "per row, whichever has paid better. Rollout and step speedups are over sync-off's medians; drafts by "
              "source: count (mean accept length) over every logged step.", ""]
    return lines + table(["drafter", "run", "rollout_s", "rollout speedup", "step speedup", "mean accept length",
                          "drafts by source"], rows) + [""]


# ---- 5b. online MTP strategies ---------------------------------------------------------------------

def drafting_rows(run: RLRun) -> list[dict]:
    """The steps that verified drafts (acceptance_rate is None on a step without drafting)."""
    return [r for r in run.rows if r.get("acceptance_rate_per_position") and r.get("acceptance_rate", 0.0) is not None]


def online_groups(res: DemoResults) -> dict[str, list[RLRun]]:
    """Base run name -> [the frozen-head run, its online-update runs] for every base with an online run."""
    groups: dict[str, list[RLRun]] = {}
    for name, run in res.rl.items():
        groups.setdefault(base_run(name), []).append(run)
    return {base: runs for base, runs in groups.items() if any(online_strategy(r.name) != "none" for r in runs)}


def window(rows: list[dict]) -> int:
    """Steps averaged at each end of a run: a third of it, 1 to 3 steps."""
    return max(1, min(3, len(rows) // 3))


def _mean(rows: list[dict], key) -> float:
    return sum(key(r) for r in rows) / len(rows)


def first_draft_trend(rows: list[dict]) -> tuple[LinearFit, float, float] | None:
    """The least-squares change of first-draft acceptance per RL step, with its 95% interval."""
    steps = [r["step"] for r in rows]
    if len(set(steps)) < 3:
        return None
    return slope_interval(steps, [r["acceptance_rate_per_position"][0] for r in rows])


def section_online(res: DemoResults) -> list[str]:
    groups = online_groups(res)
    if not groups:
        return []
    lines = ["## 5b. Online MTP updates during RL", "",
             "The same GRPO run (same model, seed and prompts) with the pre-RL head frozen (`none`) and with the head "
             "updated online by each strategy (`--mtp-update`). First / last: means over the first and the last third "
             "of the drafting steps (1 to 3 steps). Trend: the least-squares change of first-draft acceptance per 10 "
             "RL steps with its 95% interval (steps as independent points). The paper: a pre-RL e2e_tv head holds its "
             "acceptance without updates, and online ce updates erode a tv head's gain. Source: each run's "
             "`metrics.jsonl`.", ""]
    rows = []
    for base, runs in groups.items():
        for run in runs:
            drafted = drafting_rows(run)
            if not drafted:
                continue
            w = window(drafted)
            first, last = drafted[:w], drafted[-w:]
            per = lambda rs: [_mean(rs, lambda r, d=d: r["acceptance_rate_per_position"][d])  # noqa: E731
                              for d in range(len(rs[0]["acceptance_rate_per_position"]))]
            trend = first_draft_trend(drafted)
            rows.append([run.name, online_strategy(run.name), str(len(drafted)), per_pos(per(first)), per_pos(per(last)),
                         f"{f3(_mean(first, lambda r: r['mean_acceptance_length']))} / "
                         f"{f3(_mean(last, lambda r: r['mean_acceptance_length']))}",
                         slope_cell(10 * trend[0].slope, 10 * trend[1], 10 * trend[2]) if trend else "n/a",
                         f"{f3(_mean(first, lambda r: r['entropy']))} / {f3(_mean(last, lambda r: r['entropy']))}",
                         f3(_mean(run.rows, lambda r: r["reward"]))])
    lines += table(["online run", "online MTP", "drafting steps", "per position, first", "per position, last",
                    "accept length first / last", "first-draft trend per 10 steps [95%]", "policy entropy first / last",
                    "mean reward"], rows)
    return lines + ["", "![acceptance over RL steps per online strategy](plots/rl_online.png)", ""]


# ---- 5c. acceptance against the policy's entropy, across RL steps ---------------------------------

def section_rl_entropy(res: DemoResults) -> list[str]:
    lines = ["## 5c. Acceptance against the policy's entropy across RL steps", ""]
    rows = []
    for name, run in res.rl.items():
        drafted = drafting_rows(run)
        xs = [r["entropy"] for r in drafted]
        if len(set(xs)) < 3:
            continue
        length = slope_interval(xs, [r["mean_acceptance_length"] for r in drafted])
        first = slope_interval(xs, [r["acceptance_rate_per_position"][0] for r in drafted])
        rows.append([name, str(len(drafted)), f"{min(xs):.3f}-{max(xs):.3f}", _slope_cell(length), _slope_cell(first)])
    if not rows:
        return lines + missing("3 or more drafting RL steps with distinct policy entropies in a run")
    lines += ["The paper's axis: each drafting RL step is one point (the sampler's mean entropy over the step's policy "
              "tokens, the step's acceptance). Slopes are least squares over the steps with 95% t-intervals; the "
              "paper's are about -1.68 accept length per nat for TO and RS + ce, about -0.06 for RS + tv. With "
              "`--k auto` the accept length also moves with the k each step chose; the first draft is verified at "
              "every k, so its slope is the cleaner of the two. A short run spans a narrow entropy range, so its "
              "intervals are wide.", ""]
    lines += table(["speculative run", "drafting steps", "entropy range (nats)", "accept length per nat [95%]",
                    "first-draft acceptance per nat [95%]"], rows)
    return lines + ["", "![acceptance against policy entropy across RL steps](plots/rl_entropy.png)", ""]


def _slope_cell(fit: tuple[LinearFit, float, float]) -> str:
    return slope_cell(fit[0].slope, fit[1], fit[2])


# ---- figures ---------------------------------------------------------------------------------------

def write_rl_plots(res: DemoResults, plots: Path) -> list[Path]:
    from bebop.study import plots as P

    runs = {n: r for n, r in res.rl.items() if r.rows}
    if not runs:
        return []
    maybe_times = {n: step_times(r, res.warmup) for n, r in runs.items()}
    times = {n: st for n, st in maybe_times.items() if st is not None}  # all of them: every run has rows
    names = list(times)
    out = [P.plot_step_time(names, [times[n].rollout_s for n in names], [times[n].train_s for n in names],
                            [times[n].step_s for n in names], plots / "rl_step_time.png",
                            f"GRPO step time (medians after {res.warmup} warmup step(s))"),
           P.plot_rewards([(n, [r["step"] for r in run.rows], [r["reward"] for r in run.rows])
                           for n, run in runs.items()], plots / "rl_reward.png",
                          "Reward with and without speculative rollouts")]
    drafted = {n: drafting_rows(run) for n, run in runs.items()}
    drafted = {n: rows for n, rows in drafted.items() if rows}
    if drafted:
        out.append(P.plot_acceptance_per_position(
            [(n, [r["step"] for r in rows], [r["acceptance_rate_per_position"] for r in rows])
             for n, rows in drafted.items()], plots / "rl_acceptance.png", "Per-position acceptance"))
    online = [run for group in online_groups(res).values() for run in group if drafted.get(run.name)]
    if online:
        out.append(P.plot_online([(online_strategy(run.name), [r["step"] for r in drafted[run.name]],
                                   [r["acceptance_rate_per_position"][0] for r in drafted[run.name]],
                                   [r["mean_acceptance_length"] for r in drafted[run.name]]) for run in online],
                                 plots / "rl_online.png", "Acceptance over RL steps per online MTP strategy"))
    curves = []
    for n, rows in drafted.items():
        xs, ys = [r["entropy"] for r in rows], [r["mean_acceptance_length"] for r in rows]
        if len(set(xs)) >= 3:
            curves.append((n, xs, ys, slope_interval(xs, ys)[0]))
    if curves:
        out.append(P.plot_entropy_law(curves, plots / "rl_entropy.png", "Acceptance against policy entropy, per RL step",
                                      xlabel="policy entropy of the step's rollouts (nats)"))
    return out
