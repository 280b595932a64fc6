"""Real dataset rows: JSONL/parquet loading (flat and verl layouts), math-verify scoring
off the main thread with our own deadline."""

import builtins
import json
import threading
import time
from pathlib import Path

import pytest

from bebop.errors import BebopError
from bebop.tasks import DATASET_TASK, get_task, load_dataset_rows
from bebop.tasks.datasets import run_with_deadline

SAMPLE = Path(__file__).parent / "data" / "math_sample.jsonl"
math_verify = pytest.importorskip("math_verify")


def test_load_flat_and_verl_rows():
    problems = load_dataset_rows(SAMPLE)
    assert [p.ground_truth for p in problems] == ["56", "\\frac{1}{2}", "12", "2", "x^2+2x+1"]
    assert problems[3].prompt == "Put the answer in \\boxed{}.\nSolve x + 3 = 5."
    assert {p.task for p in problems} == {DATASET_TASK}


def test_load_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"prompt": [[{"role": "user", "content": "1+1?"}]],
                      "reward_model": [{"style": "rule", "ground_truth": "2"}]})
    pq.write_table(table, tmp_path / "train.parquet")
    [problem] = load_dataset_rows(tmp_path / "train.parquet")
    assert (problem.prompt, problem.ground_truth) == ("1+1?", "2")


def test_missing_key_names_row_and_key(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "a", "ground_truth": "1"}\n\n{"ground_truth": "2"}\n')
    with pytest.raises(BebopError, match="row 3 has no 'prompt' key"):
        load_dataset_rows(path)
    path.write_text('{"prompt": "a", "reward_model": {"style": "rule"}}\n')
    with pytest.raises(BebopError, match="row 1 has no 'ground_truth' key"):
        load_dataset_rows(path)
    path.write_text('{"prompt": "a", "ground_truth": "1"}\nnot json\n')
    with pytest.raises(BebopError, match="row 2 is not valid JSON"):
        load_dataset_rows(path)
    with pytest.raises(BebopError, match="file not found"):
        load_dataset_rows(tmp_path / "missing.jsonl")


def test_math_verify_scoring():
    task = get_task(DATASET_TASK)
    half, expand = load_dataset_rows(SAMPLE)[1], load_dataset_rows(SAMPLE)[4]
    assert task.score(half, "so the answer is $\\boxed{\\frac{2}{4}}$") == 1.0
    assert task.score(half, "it is 0.5") == 1.0
    assert task.score(half, "#### 2") == 0.0
    assert task.score(expand, "$x^2 + 2x + 1$") == 1.0
    assert task.score(expand, "") == 0.0
    assert task.score(expand, "{" * 200_000) == 0.0


def test_math_verify_scoring_off_the_main_thread():
    task = get_task(DATASET_TASK)
    problems = load_dataset_rows(SAMPLE)
    scores = []
    worker = threading.Thread(target=lambda: scores.extend(
        task.score(p, task.demonstration(p, None)) for p in problems))
    worker.start()
    worker.join(60)
    assert scores == [1.0] * len(problems)


def test_own_deadline_cuts_off_a_slow_check():
    start = time.monotonic()
    assert run_with_deadline(lambda: time.sleep(5) or 1, 0.1) is None
    assert time.monotonic() - start < 1.0
    assert run_with_deadline(lambda: 7, 1.0) == 7
    assert run_with_deadline(lambda: 1 / 0, 1.0) is None


def test_missing_math_verify_tells_how_to_install(monkeypatch):
    real_import = builtins.__import__

    def no_math_verify(name, *args, **kwargs):
        if name == "math_verify":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_math_verify)
    with pytest.raises(BebopError, match=r"pip install bebop\[math\]"):
        get_task(DATASET_TASK).score(load_dataset_rows(SAMPLE)[0], "56")


def test_dataset_task_has_no_generator():
    with pytest.raises(BebopError, match="no generator"):
        get_task(DATASET_TASK).problems("train", 1, 0)
    assert json.loads(json.dumps(DATASET_TASK)) == "math_dataset"
