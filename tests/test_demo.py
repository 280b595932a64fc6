"""`bebop demo --miniature` end to end: every stage runs, the report's numbers are the saved
results' numbers, the plots are real PNGs, and a rerun or a killed run reuses finished stages."""

import json
import math
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import scipy.stats

import bebop.study.demo_pipeline as pipeline
from bebop.cli import main
from bebop.engine.speculative import DEFAULT_MAX_K
from bebop.errors import BebopError
from bebop.study.demo_pipeline import DemoConfig, run_demo_pipeline, stage_policy
from bebop.study.layout import DemoLayout

PLOTS = {"loss_table.png", "entropy_law.png", "entropy_bins.png", "rl_step_time.png", "rl_reward.png", "rl_acceptance.png",
         "rl_online.png", "rl_entropy.png"}
RUNS = ["sync-off", "sync-rs", "sync-rs-both", "sync-rs-suffix", "sync-rs-online-ce", "async-off", "async-rs",
        "sync-off-long", "sync-rs-long"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The miniature demo, run once through the CLI (tests below that change it put it back)."""
    root = tmp_path_factory.mktemp("demo") / "out"
    assert main(["demo", "--miniature", "--out", str(root), "--no-progress"]) == 0
    return root


def tables(text: str) -> dict[str, list[dict]]:
    """Markdown tables by their first header cell -> rows as {header: cell}."""
    out, lines = {}, text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            header = [c.strip() for c in line.strip("|").split("|")]
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("| "):
                    break
                rows.append(dict(zip(header, (c.strip() for c in row.strip("|").split("|")))))
            out[header[0]] = rows
    return out


def same(cell: str, value: float, decimals: int = 3) -> bool:
    return abs(float(cell) - value) <= 0.5 * 10 ** -decimals + 1e-9


def load(path: Path):
    return json.loads(path.read_text())


def metrics(root: Path, run: str) -> list[dict]:
    return [json.loads(x) for x in (root / "rl" / run / "metrics.jsonl").read_text().splitlines()]


def test_every_stage_left_its_results(demo):
    layout = DemoLayout(demo)
    assert load(layout.config) == DemoConfig.miniature().to_json()
    assert load(layout.policy_result)["source"] == "trained by this demo"
    for loss in ("ce", "e2e_tv"):
        head = load(layout.head_result(loss))
        assert head["config"]["steps"] == 8 and head["config"]["loss"] == loss
        rows = load(layout.sweep_result(loss))["rows"]
        assert {(r["mode"], r["temperature"]) for r in rows} == {(m, t) for m in ("rs", "to") for t in (0.5, 1.0, 1.5)}
    for run in RUNS:
        assert [r["step"] for r in metrics(demo, run)] == [1, 2, 3]
        assert (demo / "rl" / run / "model" / "config.json").is_file()
        cfg = load(demo / "rl" / run / "config.json")
        assert (cfg["seed"], cfg["model"]) == (0, str((demo / "heads" / "e2e_tv").resolve()))
    spec_rows = metrics(demo, "sync-rs")
    assert load(demo / "rl" / "sync-rs" / "config.json")["k"] == "auto"  # the rs runs draft adaptively
    assert all(len(r["acceptance_rate_per_position"]) == DEFAULT_MAX_K for r in spec_rows)
    assert all(sum(sum(c.values()) for c in r["k_histogram"].values()) > 0 for r in spec_rows)


def test_plots_are_readable_pngs(demo):
    from matplotlib.image import imread

    assert {p.name for p in (demo / "plots").iterdir()} == PLOTS
    text = (demo / "report.md").read_text()
    for name in PLOTS:
        image = imread(demo / "plots" / name)  # decodes the whole file
        assert image.shape[0] > 200 and image.shape[1] > 300
        assert image.std() > 0.05  # not a blank canvas
        assert f"(plots/{name})" in text


def test_every_table_number_is_the_saved_value(demo):
    text = (demo / "report.md").read_text()
    t = tables(text)
    sweeps = {loss: load(demo / "results" / f"sweep-{loss}.json") for loss in ("ce", "e2e_tv")}
    heads = {loss: load(demo / "results" / f"head-{loss}.json") for loss in ("ce", "e2e_tv")}

    def point(loss, mode, temperature):
        [row] = [r for r in sweeps[loss]["rows"] if r["mode"] == mode and r["temperature"] == temperature]
        return row

    def positions(cell, values):
        parts = cell.split(" / ")
        return len(parts) == len(values) and all(same(c, v) for c, v in zip(parts, values))

    policy = load(demo / "results" / "policy.json")
    assert f"final training loss {policy['sft_final_loss']:.3f}" in text

    assert [r["head loss"] for r in t["head loss"]] == ["ce", "e2e_tv"]
    for r in t["head loss"]:
        rs, to = point(r["head loss"], "rs", 1.0), point(r["head loss"], "to", 1.0)
        assert same(r["RS acceptance"], rs["acceptance_rate"]) and same(r["TO acceptance"], to["acceptance_rate"])
        assert same(r["RS mean accept length"], rs["mean_acceptance_length"])
        assert same(r["TO mean accept length"], to["mean_acceptance_length"])
        assert positions(r["RS per position"], rs["acceptance_rate_per_position"])
        assert same(r["mean entropy (nats)"], rs["mean_entropy"])
        assert same(r["final train loss"], heads[r["head loss"]]["final_loss"])

    assert len(t["head"]) == 12
    for r in t["head"]:
        p = point(r["head"], r["mode"].lower(), float(r["T"]))
        assert same(r["mean entropy (nats)"], p["mean_entropy"]) and same(r["acceptance rate"], p["acceptance_rate"])
        assert same(r["mean accept length"], p["mean_acceptance_length"]) and same(r["pass rate"], p["pass_rate"])
        assert positions(r["per position"], p["acceptance_rate_per_position"])

    assert len(t["curve"]) == 4
    for r in t["curve"]:
        mode, loss = r["curve"].lower().split(" + ")
        pts = sorted((p for p in sweeps[loss]["rows"] if p["mode"] == mode), key=lambda p: p["temperature"])
        x = np.array([p["mean_entropy"] for p in pts])
        y = np.array([p["mean_acceptance_length"] for p in pts])
        slope, intercept = np.polyfit(x, y, 1)  # an independent least-squares fit
        r2 = np.corrcoef(x, y)[0, 1] ** 2 if np.ptp(y) > 0 else 1.0  # a flat line fits exactly (fit_line's r²)
        assert same(r["slope (per nat)"], slope) and same(r["intercept"], intercept) and same(r["r²"], r2)
        assert r["points"] == "3"

    diag = [(loss, r) for loss in ("ce", "e2e_tv") for r in sweeps[loss]["diagnostics"]]
    assert [(r["draft head"], r["depth"]) for r in t["draft head"]] == [(loss, str(d["depth"])) for loss, d in diag]
    for r, (_, d) in zip(t["draft head"], diag):
        assert same(r["KL(p‖q)"], d["kl"]) and same(r["H(q) - H(p)"], d["entropy_gap"]) and same(r["alpha"], d["alpha"])
        assert same(r["alpha p>q"], d["alpha_p_gt_q"]) and same(r["alpha q>=p"], d["alpha_q_gt_p"])
        assert r["chains"] == str(d["chains"])

    assert len(t["rule + head"]) == 4  # the per-token law at the table temperature
    for r in t["rule + head"]:
        mode, loss = r["rule + head"].lower().split(" + ")
        p = point(loss, mode, float(r["T"]))
        fit = p["first_draft_slope"]
        if fit is None:  # a miniature curve can lack drafts at distinct entropies
            assert r["drafts"] == "0"
            continue
        assert r["first-draft slope per nat [95% interval]"] == f"{fit['slope']:+.3f} [{fit['low']:+.3f}, {fit['high']:+.3f}]"
        assert int(r["drafts"]) == fit["n"] == p["num_drafts"]  # every verified chain has a first draft
        rates = [b["per_depth"][0]["rate"] for b in p["entropy_bins"]]
        assert r["first-draft acceptance by entropy bin (low to high)"] == ", ".join(
            "n/a" if x is None else f"{x:.3f}" for x in rates)

    assert [r["run"] for r in t["run"]] == RUNS
    for r in t["run"]:
        rows = metrics(demo, r["run"])
        timed = [m for m in rows if m["step"] > 1]
        assert r["steps"] == "3" and r["timed steps"] == "2-3"
        for key in ("step_s", "rollout_s", "wait_s", "train_s"):
            assert same(r[key], statistics.median(m[key] for m in timed)), (r["run"], key)
        base_run = "sync-off-long" if r["run"].endswith("-long") else "sync-off"  # each configuration's own
        base = statistics.median(m["step_s"] for m in metrics(demo, base_run) if m["step"] > 1)
        step = statistics.median(m["step_s"] for m in timed)
        assert same(r["speedup vs sync-off"], base / step, 2)
        if r["run"].startswith("sync"):
            assert same(r["rollout share"], statistics.median(m["rollout_s"] for m in timed) / step, 2)
        else:
            assert r["rollout share"] == "n/a"  # async rollouts overlap the update
        p50 = statistics.median(m["response_len_p50"] for m in rows)
        assert r["response p50 / max"] == f"{p50:.0f} / {max(m['response_len_max'] for m in rows)}"
        config = load(demo / "rl" / r["run"] / "config.json")
        assert config["difficulty"] == (2 if r["run"].endswith("-long") else 1)
        assert same(r["mean reward"], statistics.mean(m["reward"] for m in rows))
        assert same(r["mean accept length"], statistics.mean(m["mean_acceptance_length"] for m in rows))

    assert [(r["mode"], r["spec"]) for r in t["mode"]] == [("sync", "rs"), ("async", "rs"), ("sync-long", "rs")]
    for r in t["mode"]:
        mode, _, tag = r["mode"].partition("-")
        off = [m["reward"] for m in metrics(demo, f"{mode}-off" + (f"-{tag}" if tag else ""))]
        on = [m["reward"] for m in metrics(demo, f"{mode}-rs" + (f"-{tag}" if tag else ""))]
        se = math.hypot(statistics.stdev(off) / math.sqrt(3), statistics.stdev(on) / math.sqrt(3))
        assert same(r["reward (spec off)"], statistics.mean(off)) and same(r["reward (spec on)"], statistics.mean(on))
        assert same(r["difference"], statistics.mean(on) - statistics.mean(off)) and same(r["s.e."], se)


def _slope_cell(xs, ys, scale=1.0) -> str:
    """An independent least-squares slope with its 95% t-interval (numpy; scipy's t quantiles)."""
    x, y = np.array(xs, dtype=float), np.array(ys, dtype=float)
    slope, intercept = np.polyfit(x, y, 1)
    se = math.sqrt(((y - (intercept + slope * x)) ** 2).sum() / (len(x) - 2) / ((x - x.mean()) ** 2).sum())
    half = float(scipy.stats.t.ppf(0.975, len(x) - 2)) * se
    cell = lambda v: f"{round(v, 3) + 0.0:+.3f}"  # noqa: E731 -- a value rounding to zero prints +0.000, as the report
    return f"{cell(scale * slope)} [{cell(scale * (slope - half))}, {cell(scale * (slope + half))}]"


def test_the_drafters_table_is_the_saved_values(demo):
    """Section 5's drafter table: the sync rs runs with each drafter, their rollouts against sync-off's, and the
    drafts each source made, summed over the runs' metrics."""
    t = tables((demo / "report.md").read_text())
    rows = {r["run"]: r for r in t["drafter"]}
    assert [(r["run"], r["drafter"]) for r in rows.values()] == [("sync-rs", "mtp"), ("sync-rs-both", "both"),
                                                                 ("sync-rs-suffix", "suffix")]
    off = statistics.median(m["rollout_s"] for m in metrics(demo, "sync-off") if m["step"] > 1)
    for name, r in rows.items():
        got = metrics(demo, name)
        assert same(r["rollout speedup"], off / statistics.median(m["rollout_s"] for m in got if m["step"] > 1), 2)
        drafts: dict = {}
        for m in got:
            for source, by in m["drafts_by_source"].items():
                drafts[source] = drafts.get(source, 0) + by["num_drafts"]
        assert [cell.split(" (")[0] for cell in r["drafts by source"].split(", ")] == \
            [f"{s} {n}" for s, n in sorted(drafts.items())] or (not drafts and r["drafts by source"] == "-")
    assert set(metrics(demo, "sync-rs-suffix")[-1]["drafts_by_source"]) <= {"suffix"}


def test_online_and_rl_entropy_sections_are_the_saved_values(demo):
    t = tables((demo / "report.md").read_text())
    online = metrics(demo, "sync-rs-online-ce")
    assert all(r["mtp_loss"] is not None for r in online)  # the head was updated online
    assert [(r["online run"], r["online MTP"]) for r in t["online run"]] == [("sync-rs", "none"),
                                                                          ("sync-rs-online-ce", "ce")]
    for r in t["online run"]:
        rows = [m for m in metrics(demo, r["online run"]) if m["acceptance_rate"] is not None]
        assert r["drafting steps"] == str(len(rows))
        first, last = rows[0], rows[-1]  # 3 steps: a window of one step at each end
        assert r["per position, first"] == " / ".join(f"{v:.3f}" for v in first["acceptance_rate_per_position"])
        assert r["per position, last"] == " / ".join(f"{v:.3f}" for v in last["acceptance_rate_per_position"])
        assert r["policy entropy first / last"] == f"{first['entropy']:.3f} / {last['entropy']:.3f}"
        if len(rows) == 3:
            assert r["first-draft trend per 10 steps [95%]"] == _slope_cell(
                [m["step"] for m in rows], [m["acceptance_rate_per_position"][0] for m in rows], scale=10)
    checked = 0
    for r in t["speculative run"]:
        rows = [m for m in metrics(demo, r["speculative run"]) if m["acceptance_rate"] is not None]
        xs = [m["entropy"] for m in rows]
        assert r["entropy range (nats)"] == f"{min(xs):.3f}-{max(xs):.3f}"
        assert r["accept length per nat [95%]"] == _slope_cell(xs, [m["mean_acceptance_length"] for m in rows])
        assert r["first-draft acceptance per nat [95%]"] == _slope_cell(
            xs, [m["acceptance_rate_per_position"][0] for m in rows])
        checked += 1
    assert checked >= 1


def test_stage_times_are_the_recorded_seconds(demo):
    text = (demo / "report.md").read_text()
    assert "**Miniature configuration**" in text
    rows = {r["stage"]: r for r in tables(text)["stage"]}
    assert same(rows["policy"]["seconds"], load(demo / "results" / "policy.json")["seconds"], 1)
    for loss in ("ce", "e2e_tv"):
        assert same(rows[f"head {loss}"]["seconds"], load(demo / "results" / f"head-{loss}.json")["seconds"], 1)
        assert same(rows[f"sweep {loss}"]["seconds"], load(demo / "results" / f"sweep-{loss}.json")["meta"]["seconds"], 1)
    for run in RUNS:
        assert same(rows[f"RL {run}"]["seconds"], sum(m["step_s"] for m in metrics(demo, run)), 1)


def test_report_command_rebuilds_the_same_page(demo):
    before = (demo / "report.md").read_text()
    (demo / "report.md").unlink()
    assert main(["report", str(demo)]) == 0
    assert (demo / "report.md").read_text() == before


def _forbid(monkeypatch, *names):
    def boom(*args, **kwargs):
        raise AssertionError("a finished stage ran again")

    for name in names:
        monkeypatch.setattr(pipeline, name, boom)


def _record(monkeypatch, calls, name):
    real = getattr(pipeline, name)

    def wrapper(*args, **kwargs):
        calls.append((name, kwargs.get("resume")))
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, name, wrapper)


def test_rerun_reuses_every_stage(demo, monkeypatch):
    before = (demo / "report.md").read_text()
    _forbid(monkeypatch, "train_sft", "train_mtp", "evaluate_mtp", "train_rl", "headed_copy")
    run_demo_pipeline(demo, DemoConfig.miniature(), progress=False)
    assert (demo / "report.md").read_text() == before


def test_a_killed_demo_resumes_only_the_unfinished_stages(demo, monkeypatch):
    """As if killed after the e2e_tv head's last checkpoint and during the async-rs run."""
    import shutil

    (demo / "results" / "head-e2e_tv.json").unlink()
    (demo / "results" / "sweep-e2e_tv.json").unlink()
    shutil.rmtree(demo / "rl" / "async-rs" / "model")
    calls = []
    for name in ("train_mtp", "evaluate_mtp", "train_rl"):
        _record(monkeypatch, calls, name)
    _forbid(monkeypatch, "train_sft", "headed_copy")
    run_demo_pipeline(demo, DemoConfig.miniature(), progress=False)
    assert calls == [("train_mtp", True), ("evaluate_mtp", None), ("train_rl", True)]
    assert [r["step"] for r in metrics(demo, "async-rs")] == [1, 2, 3]
    assert (demo / "rl" / "async-rs" / "model" / "config.json").is_file()
    test_every_table_number_is_the_saved_value(demo)


def test_another_config_in_the_same_directory_is_refused(demo):
    with pytest.raises(BebopError, match="differs in head_steps"):
        run_demo_pipeline(demo, replace(DemoConfig.miniature(), head_steps=9), progress=False)


def test_config_file_sets_fields_over_the_miniature(demo, tmp_path, capsys):
    (tmp_path / "study.toml").write_text('rl_steps = 4\nrl_online = ["ce", "e2e_tv"]\n')
    assert main(["demo", "--miniature", "--no-progress", "--config", str(tmp_path / "study.toml"), "--out", str(demo)]) == 2
    assert "differs in rl_online, rl_steps" in capsys.readouterr().err  # read, applied, then refused before any work
    (tmp_path / "bad.toml").write_text("rl_stepz = 4\n")
    assert main(["demo", "--miniature", "--config", str(tmp_path / "bad.toml"), "--out", str(demo)]) == 2
    assert "unknown setting(s) rl_stepz" in capsys.readouterr().err


def test_a_given_policy_is_reused_and_reported(demo, tmp_path):
    cfg = replace(DemoConfig.miniature(), policy=str(demo / "policy"))
    layout = DemoLayout(tmp_path / "other")
    assert stage_policy(layout, cfg, progress=False) == demo / "policy"
    saved = load(layout.policy_result)
    assert saved["source"] == "reused (given with --policy)" and saved["model_dir"] == str((demo / "policy").resolve())
    assert stage_policy(layout, cfg, progress=False) == demo / "policy"  # read back from results/policy.json


def test_config_round_trips_and_is_validated():
    cfg = DemoConfig.miniature()
    assert DemoConfig.from_json(cfg.to_json()) == cfg
    assert DemoConfig.from_json(DemoConfig().to_json()) == DemoConfig()
    for bad, message in [(dict(temperatures=(1.0,)), "at least 2 distinct"),
                         (dict(table_temperature=0.7), "table_temperature"),
                         (dict(rl_head="tv"), "rl_head"),
                         (dict(rl_warmup_steps=3), "rl_warmup_steps"),
                         (dict(losses=("ce", "nope"), rl_head="ce"), "unknown loss")]:
        with pytest.raises(BebopError, match=message):
            replace(cfg, **bad).validate()
    with pytest.raises(BebopError, match="unknown demo config fields: bogus"):
        DemoConfig.from_json({**cfg.to_json(), "bogus": 1})


def test_full_default_sizes():
    """The full demo: both heads, the paper's K, five temperatures, four RL runs with one shared setup."""
    cfg = DemoConfig()
    cfg.validate()
    assert cfg.losses == ("ce", "e2e_tv") and cfg.k == 3 and cfg.temperatures == (0.3, 0.5, 0.7, 1.0, 1.3)
    runs = cfg.rl_configs(Path("m"))
    assert set(runs) == set(RUNS)
    assert runs["sync-rs-online-ce"].mtp_update == "ce" and runs["sync-rs"].mtp_update == "none"
    assert runs["sync-rs-suffix"].decode.drafter == "suffix"
    assert runs["sync-rs-long"].difficulty == 2 and runs["sync-rs-long"].decode.spec == "rs"
    assert {c.difficulty for name, c in runs.items() if not name.endswith("-long")} == {1}
    assert len({(c.seed, c.steps, c.group_size, c.batch_prompts) for c in cfg.rl_configs(Path("m")).values()}) == 1
