"""`bebop tasks sample|score` through a tiny argparse harness (the main CLI calls register)."""

import argparse
import json

import pytest

from bebop.errors import BebopError
from bebop.tasks.cli import register


def run(argv, capsys) -> list[dict]:
    parser = argparse.ArgumentParser(prog="bebop")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    args.func(args)
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.mark.parametrize("task", ["math", "code", "agent", "mix"])
def test_sample_then_score_round_trip(task, tmp_path, capsys):
    rows = run(["tasks", "sample", "--task", task, "--n", "6", "--seed", "3",
                "--split", "test"], capsys)
    assert len(rows) == 6
    assert all(set(r) == {"prompt", "reference", "ground_truth", "task"} for r in rows)
    path = tmp_path / "completions.jsonl"
    lines = [dict(r, completion=r["reference"]) for r in rows]
    lines[0]["completion"] = "nonsense"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    scored = run(["tasks", "score", "--task", task, str(path)], capsys)
    assert [r["reward"] for r in scored] == [0.0] + [1.0] * 5
    assert [{k: v for k, v in r.items() if k != "reward"} for r in scored] == lines


def test_sample_is_deterministic(capsys):
    argv = ["tasks", "sample", "--task", "math", "--n", "3", "--seed", "1"]
    assert run(argv, capsys) == run(argv, capsys)


def test_unknown_task_lists_known_ones(capsys):
    with pytest.raises(BebopError, match="known tasks: math, code, agent, mix"):
        run(["tasks", "sample", "--task", "poker", "--n", "1"], capsys)


def test_missing_key_names_row_and_key(tmp_path, capsys):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "p", "completion": "c", "ground_truth": "{}"}) + "\n"
                    + json.dumps({"prompt": "p", "ground_truth": "{}"}) + "\n")
    with pytest.raises(BebopError, match="row 2 has no 'completion' key"):
        run(["tasks", "score", "--task", "math", str(path)], capsys)
    with pytest.raises(BebopError, match="row 1 has no 'task' key"):
        run(["tasks", "score", "--task", "mix", str(path)], capsys)


def test_unreadable_file(tmp_path, capsys):
    with pytest.raises(BebopError, match="file not found"):
        run(["tasks", "score", "--task", "math", str(tmp_path / "nope.jsonl")], capsys)
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(BebopError, match="cannot read"):
        run(["tasks", "score", "--task", "math", str(tmp_path / "bin.jsonl")], capsys)


def test_score_dataset_rows(tmp_path, capsys):
    pytest.importorskip("math_verify")
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "7*8?", "completion": "#### 56", "ground_truth": "56"})
                    + "\n")
    [row] = run(["tasks", "score", "--task", "math_dataset", str(path)], capsys)
    assert row["reward"] == 1.0
