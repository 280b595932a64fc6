"""Math answers checked with math-verify: `\\boxed{}` or final answers against a ground truth.

    math_verify_reward(data_source, solution_str, ground_truth, extra_info) -> 1.0 or 0.0

math-verify's own timeouts use signal.alarm, which only works on the main thread (verl
#5635: scores silently became 0 off it). We switch them off and run each check in a
daemon worker thread with our own deadline instead, so scoring works from any thread. A
check that overruns scores 0; its thread is abandoned (Python cannot kill a thread).

`DatasetMathTask` (task "math_dataset") scores a Problem's completion the same way: the task
`bebop tasks score --task math_dataset` uses.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from bebop.errors import BebopError
from bebop.tasks.base import Problem

DATASET_TASK = "math_dataset"
VERIFY_TIMEOUT_S = 5.0
MAX_DATASET_COMPLETION_CHARS = 100_000

T = TypeVar("T")


def require_math_verify() -> Any:
    try:
        import math_verify
    except ImportError:
        raise BebopError("scoring math answers needs math-verify: pip install bebop[math]") from None
    return math_verify


def run_with_deadline(fn: Callable[[], T], seconds: float) -> T | None:
    """fn() in a daemon thread; None if it raises or is still running after `seconds`."""
    box: list[T] = []

    def target() -> None:
        try:
            box.append(fn())
        except Exception:  # a library failure on odd input scores 0, like a wrong answer
            pass

    worker = threading.Thread(target=target, daemon=True, name="bebop-math-verify")
    worker.start()
    worker.join(seconds)
    return box[0] if box else None


def verify_answer(ground_truth: str, completion: str) -> bool:
    """math-verify's judgement, with its signal-based timeouts switched off."""
    mv = require_math_verify()
    gold = mv.parse("\\boxed{" + ground_truth + "}", parsing_timeout=None)
    answer = mv.parse(completion, parsing_timeout=None)
    return bool(gold and answer and mv.verify(gold, answer, timeout_seconds=None))


def score_math(ground_truth: str, completion: str, timeout_s: float = VERIFY_TIMEOUT_S) -> float:
    """1.0 when math-verify finds the completion's answer equal to the ground truth, else 0.0."""
    require_math_verify()  # a missing library is a setup error, not a wrong answer
    if len(completion) > MAX_DATASET_COMPLETION_CHARS:
        return 0.0
    return 1.0 if run_with_deadline(lambda: verify_answer(ground_truth, completion), timeout_s) else 0.0


def checkable_truth(value: Any) -> bool:
    """A ground truth the math reward can check: text or a number (not a bool, a list or None)."""
    return not isinstance(value, bool) and isinstance(value, (str, int, float))


def math_verify_reward(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None) -> float:
    """The built-in `math` reward, with verl's custom-reward signature."""
    if not checkable_truth(ground_truth):
        raise BebopError(f"the math reward needs a ground truth that is text or a number, got {ground_truth!r}")
    return score_math(str(ground_truth), solution_str)


class DatasetMathTask:
    """Scores completions to problems with math-verify (no generator of its own)."""

    name = DATASET_TASK

    def __init__(self, timeout_s: float = VERIFY_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        raise BebopError(f"{DATASET_TASK} has no generator; train on a file with --data FILE")

    def demonstration(self, problem: Problem, rng: Any) -> str:
        return f"The answer is $\\boxed{{{problem.ground_truth}}}$."

    def score(self, problem: Problem, completion: str) -> float:
        return score_math(problem.ground_truth, completion, self.timeout_s)

    def observe(self, problem: Problem, transcript: str) -> str | None:
        return None
