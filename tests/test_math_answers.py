"""math-verify scoring: \\boxed{} and final answers, off the main thread with our own deadline."""

import builtins
import threading
import time

import pytest

from bebop.errors import BebopError
from bebop.tasks import DATASET_TASK, Problem, get_task
from bebop.tasks.math_answers import math_verify_reward, run_with_deadline

math_verify = pytest.importorskip("math_verify")
HALF, EXPAND = Problem("Simplify 2/4.", "\\frac{1}{2}", DATASET_TASK), Problem("Expand", "x^2+2x+1", DATASET_TASK)


def test_math_verify_scoring():
    task = get_task(DATASET_TASK)
    assert task.score(HALF, "so the answer is $\\boxed{\\frac{2}{4}}$") == 1.0
    assert task.score(HALF, "it is 0.5") == 1.0
    assert task.score(HALF, "#### 2") == 0.0
    assert task.score(EXPAND, "$x^2 + 2x + 1$") == 1.0
    assert task.score(EXPAND, "") == 0.0
    assert task.score(EXPAND, "{" * 200_000) == 0.0


def test_the_builtin_reward_has_verls_signature():
    assert math_verify_reward("openai/gsm8k", "so #### 72", "72", None) == 1.0
    assert math_verify_reward("openai/gsm8k", "The answer is \\boxed{12}.", 12, {"index": 3}) == 1.0
    assert math_verify_reward("openai/gsm8k", "The answer is \\boxed{13}.", 12, {}) == 0.0
    with pytest.raises(BebopError, match="needs a ground truth that is text or a number"):
        math_verify_reward("openai/gsm8k", "12", ["12"], None)


def test_math_verify_scoring_off_the_main_thread():
    task = get_task(DATASET_TASK)
    problems = [HALF, EXPAND, Problem("7*8", "56", DATASET_TASK)]
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
        get_task(DATASET_TASK).score(HALF, "56")


def test_math_dataset_task_has_no_generator():
    with pytest.raises(BebopError, match="no generator; train on a file with --data FILE"):
        get_task(DATASET_TASK).problems("train", 1, 0)
