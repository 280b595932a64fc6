"""The entropy law across RL steps (bebop.study.rl_entropy), on worked cases: an exact line gives its slope with
a zero-width interval and puts the whole acceptance change in the entropy part; a head that falls behind
shows up as the mismatch part."""

import json
import math

import pytest

from bebop.cli import main
from bebop.study.rl_entropy import entropy_law


def _run(path, rows):
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _row(step, entropy, length, first, *, drafted=True, sampler=True):
    return {"step": step, "entropy": entropy if sampler else None, "train_entropy": entropy, "reward": 0.5,
            "mean_acceptance_length": length, "acceptance_rate": 0.5 if drafted else None,
            "acceptance_rate_per_position": [first, 0.3]}


def test_an_exact_line_is_all_entropy_part_and_a_drift_is_mismatch(tmp_path):
    entropies = [0.5 + 0.05 * i for i in range(20)]
    law_line = [_row(i + 1, h, 3.0 - 1.5 * h, 0.9 - 0.4 * h) for i, h in enumerate(entropies)]
    law_line.insert(3, _row(99, 5.0, 1.0, 0.1, drafted=False))  # a step without drafting: not a point
    drift = [_row(i + 1, h, 3.0 - 1.5 * h - 0.01 * i * (i % 2), 0.8, sampler=False) for i, h in enumerate(entropies)]
    law = entropy_law({"RS + ce": _run(tmp_path / "a", law_line), "RS + tv": _run(tmp_path / "b", drift)}, window=5)
    line = law["runs"]["RS + ce"]
    assert line["steps"] == 20 and line["entropy_min"] == 0.5 and line["entropy_max"] == pytest.approx(1.45)
    length = line["mean_acceptance_length"]
    assert length["slope"] == pytest.approx(-1.5) and length["high"] - length["low"] == pytest.approx(0, abs=1e-9)
    assert line["first_draft"]["slope"] == pytest.approx(-0.4)
    d_h = sum(entropies[-5:]) / 5 - sum(entropies[:5]) / 5
    assert length["change"] == pytest.approx(-1.5 * d_h) == pytest.approx(length["entropy_part"])
    assert length["mismatch_part"] == pytest.approx(0, abs=1e-12)
    other = law["runs"]["RS + tv"]["mean_acceptance_length"]  # entropy from train_entropy where the sampler has none
    assert other["entropy_part"] + other["mismatch_part"] == pytest.approx(other["change"])
    assert not math.isclose(other["mismatch_part"], 0, abs_tol=1e-3)


def test_the_report_command_writes_the_table_and_refuses_bad_runs(tmp_path, capsys):
    run = _run(tmp_path / "run", [_row(i + 1, 0.5 + 0.1 * i, 2.5 - 0.3 * i, 0.7) for i in range(6)])
    out = tmp_path / "law.md"
    assert main(["report", "--entropy-law", str(out), "--window", "2", f"TO + ce={run}"]) == 0
    text = out.read_text()
    assert "| TO + ce | 6 | 0.500-1.000 (2.0x) | -3.000 [-3.000, -3.000] |" in text
    assert json.loads(out.with_suffix(".json").read_text())["window"] == 2
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    for argv, message in [([str(run)], "NAME=RUN_DIR"), ([f"x={tmp_path / 'none'}"], "not an RL run directory"),
                          (["--window", "0", f"x={run}"], "--window must be >= 1")]:
        assert main(["report", "--entropy-law", str(tmp_path / "bad.md"), *argv]) == 2
        assert message in capsys.readouterr().err
    flat = _run(tmp_path / "flat", [_row(i + 1, 0.5, 2.0, 0.7) for i in range(5)])
    assert main(["report", "--entropy-law", str(tmp_path / "bad.md"), f"x={flat}"]) == 2
    assert "distinct entropies" in capsys.readouterr().err and not (tmp_path / "bad.md").exists()
