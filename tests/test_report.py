"""The demo report from a fixed, hand-made log set (tests/data/report_fixture), and the entropy-law
fit. Every expected row below was computed by hand from the fixture's files (comments show how)."""

import shutil
import struct
from pathlib import Path

import pytest

from bebop.cli import main
from bebop.errors import BebopError
from bebop.study.entropy_law import fit_line
from bebop.study.report import load_results, write_report

FIXTURE = Path(__file__).parent / "data" / "report_fixture"


@pytest.fixture()
def demo_dir(tmp_path):
    root = tmp_path / "demo"
    shutil.copytree(FIXTURE, root)
    return root


def _report(root, plots=False) -> str:
    return write_report(root, plots=plots).read_text()


def test_policy_line(demo_dir):
    text = _report(demo_dir)
    assert ("The math policy in `policy` was **reused (already trained in this directory)**: SFT for 650 steps, "
            "final training loss 0.500 (mean of the last 20 steps), 3,000,000 parameters. "
            "Source: `results/policy.json`.") in text


def test_loss_table_rows(demo_dir):
    text = _report(demo_dir)
    # T=1 rows of results/sweep-<loss>.json; acceptance_rate = (L - 1) / 3 as written by the fixture
    assert "| ce | 0.600 | 0.500 | 2.800 | 2.500 | 0.800 / 0.600 / 0.400 | 1.000 | 1.250 |" in text
    assert "| e2e_tv | 0.800 | 0.500 | 3.400 | 2.500 | 0.900 / 0.800 / 0.700 | 1.000 | 0.400 |" in text
    assert "Heads trained 150 steps over 5 depths on 256 self-distilled samples" in text
    assert "at K=3, T=1 on 4 test prompts (seed 0, at most 64 new tokens)" in text


def test_sweep_rows(demo_dir):
    text = _report(demo_dir)
    assert "| ce | TO | 0.5 | 0.500 | 0.667 | 3.000 | 0.500 / 0.400 / 0.300 | 0.750 |" in text
    assert "| e2e_tv | RS | 1.5 | 1.500 | 0.817 | 3.450 | 0.500 / 0.400 / 0.300 | 0.250 |" in text
    sweep = text.split("## 3.")[1].split("## 4.")[0]
    assert sum(line.startswith("| ce ") or line.startswith("| e2e_tv ") for line in sweep.splitlines()) == 12


def test_entropy_law_rows(demo_dir):
    text = _report(demo_dir)
    # TO+ce: L = 3.5 - 1.0 H exactly; RS+ce: L = 4.0 - 1.2 H exactly
    assert "| TO + ce | -1.000 | 3.500 | 1.000 | 3 | -1.68 |" in text
    assert "| RS + ce | -1.200 | 4.000 | 1.000 | 3 | -1.68 |" in text
    # TO+e2e_tv: L = 3.1, 2.5, 2.2: Sxy = -0.45, Sxx = 0.5 -> slope -0.9, intercept 2.6 + 0.9 = 3.5;
    # residuals 0.05, -0.1, 0.05 -> SSres 0.015, SStot 0.42 -> r2 = 1 - 0.015/0.42 = 0.964
    assert "| TO + e2e_tv | -0.900 | 3.500 | 0.964 | 3 | -1.68 |" in text
    # RS+e2e_tv: L = 3.5, 3.4, 3.45: slope -0.05, intercept 3.5; SSres 0.00375, SStot 0.005 -> r2 0.25
    assert "| RS + e2e_tv | -0.050 | 3.500 | 0.250 | 3 | -0.06 |" in text


def test_rl_rows(demo_dir):
    text = _report(demo_dir)
    # medians over steps 2-3 (warmup 1); speedup = 5.0 / median step_s
    # rollout share = rollout_s / step_s of a sync run; the fixture logs no response lengths
    assert "| sync-off | 3 | 2-3 | 5.000 | 4.250 | 4.250 | 0.750 | 0.85 | 1.00 | 0.400 | 1.000 | - |" in text
    assert "| sync-rs | 3 | 2-3 | 2.500 | 2.000 | 2.000 | 0.500 | 0.80 | 2.00 | 0.500 | 3.200 | - |" in text
    assert "| async-off | 3 | 2-3 | 3.500 | 3.400 | 2.500 | 1.000 | n/a | 1.43 | 0.300 | 1.000 | - |" in text
    assert "| async-rs | 3 (unfinished) | 2-3 | 2.000 | 1.600 | 1.000 | 1.000 | n/a | 2.50 | 0.900 | 3.400 | - |" in text
    rl = text.split("## 5.")[1]
    order = [line.split(" | ")[0] for line in rl.splitlines() if line.startswith("| sync-") or line.startswith("| async-")]
    assert order == ["| sync-off", "| sync-rs", "| async-off", "| async-rs"]


def test_lossless_rows(demo_dir):
    text = _report(demo_dir)
    # sync: rewards 0.2,0.4,0.6 vs 0.3,0.5,0.7: s.e. each 0.2/sqrt(3) -> difference s.e. 0.1633
    assert "| sync | rs | 0.400 | 0.500 | +0.100 | 0.163 | yes |" in text
    # async: 0.1,0.3,0.5 vs 0.9,0.9,0.9: s.e. 0.1155 and 0 -> +0.6 is more than 2 s.e.
    assert "| async | rs | 0.300 | 0.900 | +0.600 | 0.115 | no |" in text


def test_plots_are_png_files(demo_dir):
    write_report(demo_dir)
    names = {p.name for p in (demo_dir / "plots").iterdir()}
    assert names == {"loss_table.png", "entropy_law.png", "rl_step_time.png", "rl_reward.png", "rl_acceptance.png"}
    for name in names:
        data = (demo_dir / "plots" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
        width, height = struct.unpack(">II", data[16:24])
        assert width > 300 and height > 200


def test_missing_stages_are_named_not_invented(demo_dir):
    shutil.rmtree(demo_dir / "rl")
    (demo_dir / "results" / "sweep-e2e_tv.json").unlink()
    text = _report(demo_dir)
    assert "_Not run yet: rl/<mode>-<spec>/metrics.jsonl._" in text
    assert "| e2e_tv |" not in text.split("## 3.")[1]
    assert "| ce | 0.600 | 0.500 |" in text


def test_cli_rebuilds_the_report_and_rejects_an_empty_dir(demo_dir, tmp_path, capsys):
    assert main(["report", str(demo_dir), "--no-plots"]) == 0
    assert (demo_dir / "report.md").is_file() and not (demo_dir / "plots").exists()
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "holds no demo results" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "nope")]) == 2


def test_malformed_metrics_is_a_clear_error(demo_dir):
    (demo_dir / "rl" / "sync-off" / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(BebopError, match="metrics.jsonl: row 1 has no 'reward' key"):
        load_results(demo_dir)


def test_fit_recovers_a_known_line():
    import random

    rng = random.Random(0)
    xs = [0.2 + 0.05 * i for i in range(40)]
    ys = [3.7 - 1.68 * x + rng.gauss(0, 0.01) for x in xs]
    fit = fit_line(xs, ys)
    # noise s.d. 0.01 over an x range of 1.95: the slope's standard error is ~0.003
    assert fit.slope == pytest.approx(-1.68, abs=0.015)
    assert fit.intercept == pytest.approx(3.7, abs=0.02)
    assert fit.r2 > 0.99 and fit.n == 40
    exact = fit_line([0.5, 1.0, 1.5], [3.5, 3.4, 3.45])
    assert (exact.slope, exact.intercept, exact.r2) == pytest.approx((-0.05, 3.5, 0.25))


def test_fit_rejects_degenerate_input():
    with pytest.raises(BebopError, match="at least 2 points"):
        fit_line([1.0], [2.0])
    with pytest.raises(BebopError, match="distinct"):
        fit_line([1.0, 1.0], [2.0, 3.0])
    with pytest.raises(BebopError, match="x values"):
        fit_line([1.0, 2.0], [2.0])


def test_stage_times_table(demo_dir):
    text = _report(demo_dir)
    assert "| policy | 0.1 | SFT (0 when reused) | `results/policy.json` |" in text
    assert "| RL sync-off | 20.0 | sum of step_s (no setup or checkpoints) | `rl/sync-off/metrics.jsonl` |" in text
    assert "Miniature configuration" not in text


def test_slope_interval_by_hand():
    from bebop.study.entropy_law import slope_interval
    # Sxx = 5, Sxy = 4.5 -> slope 0.9, intercept -0.1; residuals 0.1, 0.2, -0.7, 0.4 -> SSres 0.70;
    # se = sqrt(0.70 / 2 / 5) = 0.264575; t(0.975, df 2) = 4.302653 -> half-width 1.138375
    fit, low, high = slope_interval([0, 1, 2, 3], [0, 1, 1, 3])
    assert fit.slope == pytest.approx(0.9) and fit.intercept == pytest.approx(-0.1)
    assert low == pytest.approx(0.9 - 1.138375, abs=1e-5) and high == pytest.approx(0.9 + 1.138375, abs=1e-5)
    with pytest.raises(BebopError, match="at least 3 points"):
        slope_interval([0, 1], [0, 1])


def test_report_rebuilds_a_loss_study_from_its_json(tmp_path, capsys):
    """`bebop report FILE.json`: the seeded loss table and its interval plot, from the results alone."""
    import json

    rows = [{"loss": "ce", "seeds": [0, 1], "mean_entropy": 0.2, "rs_per_position": [0.7, 0.5, 0.4],
             "rs_acceptance_rate": [0.55, 0.5, 0.6], "to_acceptance_rate": [0.5, 0.45, 0.55],
             "rs_mean_acceptance_length": [2.6, 2.5, 2.7], "rs_acceptance_rate_vs_ce": [0.0, 0.0, 0.0],
             "to_acceptance_rate_vs_ce": [0.0, 0.0, 0.0]},
            {"loss": "e2e_tv", "seeds": [0, 1], "mean_entropy": 0.2, "rs_per_position": [0.7, 0.5, 0.4],
             "rs_acceptance_rate": [0.57, 0.52, 0.62], "to_acceptance_rate": [0.5, 0.45, 0.55],
             "rs_mean_acceptance_length": [2.6, 2.6, 2.6], "rs_acceptance_rate_vs_ce": [0.02, -0.01, 0.05],
             "to_acceptance_rate_vs_ce": [0.0, 0.0, 0.0]}]
    meta = {"task": "math", "steps": 10, "depths": 3, "k": 3, "temperature": 1.0, "n_eval": 4, "num_samples": 8,
            "seeds": [0, 1], "ce_warmup": 0.0, "command": "bebop mtp study ..."}
    path = tmp_path / "study.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}))
    assert main(["report", str(path)]) == 0
    text = (tmp_path / "study.md").read_text()
    assert "| e2e_tv | 57.0% [52.0, 62.0] | +2.0 [-1.0, +5.0] | 50.0% [45.0, 55.0] |" in text
    assert (tmp_path / "study.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "bad.json").write_text("[1]")
    assert main(["report", str(tmp_path / "bad.json")]) == 2
    assert "is not a loss study's results" in capsys.readouterr().err


def test_a_slope_that_rounds_to_zero_prints_plus_zero():
    """A flat fit's float noise has either sign; the report prints it as +0.000 (the demo test's independent
    fit would otherwise disagree on the sign of zero)."""
    from bebop.study.report_format import signed3, slope_cell

    assert [signed3(v) for v in (-1e-10, -4e-4, 0.0, -0.0, 6e-4, -6e-4)] == \
        ["+0.000", "+0.000", "+0.000", "+0.000", "+0.001", "-0.001"]
    assert slope_cell(-1e-17, -2e-12, 0.25) == "+0.000 [+0.000, +0.250]"
