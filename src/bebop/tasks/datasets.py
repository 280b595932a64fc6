"""Real math datasets: read JSONL or parquet rows, score answers with math-verify.

Rows use the layout RL frameworks use: a `prompt` (a string, or a list of chat messages
whose `content`s are joined with newlines) and a `ground_truth` answer, either at the top
level or nested as verl writes it, `reward_model.ground_truth`.

math-verify's own timeouts use signal.alarm, which only works on the main thread (verl
#5635: scores silently became 0 off it). We switch them off and run each check in a
daemon worker thread with our own deadline instead, so scoring works from any thread. A
check that overruns scores 0; its thread is abandoned (Python cannot kill a thread).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from bebop.errors import BebopError
from bebop.jsonl import read_numbered
from bebop.tasks.base import Problem

DATASET_TASK = "math_dataset"
VERIFY_TIMEOUT_S = 5.0
MAX_DATASET_COMPLETION_CHARS = 100_000

T = TypeVar("T")


def require_math_verify() -> Any:
    try:
        import math_verify
    except ImportError:
        raise BebopError("scoring dataset rows needs math-verify: pip install bebop[math]") from None
    return math_verify


Rows = list[tuple[int, dict]]  # (1-based row number, row)


def read_parquet(path: str | os.PathLike) -> Rows:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise BebopError("reading parquet needs pyarrow: pip install pyarrow") from None
    try:
        rows = pq.read_table(path).to_pylist()
    except (OSError, ValueError) as exc:  # pyarrow's errors subclass these
        raise BebopError(f"cannot read {path}: {str(exc).splitlines()[0]}") from None
    return list(enumerate(rows, start=1))


def require(row: dict, key: str, number: int, path: str | os.PathLike) -> Any:
    """row[key], or a BebopError naming the file, the row number and the key."""
    if key not in row:
        raise BebopError(f"{path}: row {number} has no {key!r} key")
    return row[key]


def _prompt_text(value: Any, number: int, path: str | os.PathLike) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(m, dict) and "content" in m for m in value):
        return "\n".join(str(m["content"]) for m in value)
    raise BebopError(f"{path}: row {number} 'prompt' is neither text nor chat messages")


def _ground_truth(row: dict, number: int, path: str | os.PathLike) -> str:
    nested = row.get("reward_model")
    if "ground_truth" in row:
        value = row["ground_truth"]
    elif isinstance(nested, dict) and "ground_truth" in nested:
        value = nested["ground_truth"]
    else:
        raise BebopError(f"{path}: row {number} has no 'ground_truth' key "
                         "(nor 'reward_model.ground_truth')")
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise BebopError(f"{path}: row {number} 'ground_truth' must be text or a number")
    return str(value)


def load_dataset_rows(path: str | os.PathLike) -> list[Problem]:
    """Problems (task 'math_dataset') from a .jsonl or .parquet file."""
    rows = read_parquet(path) if str(path).endswith(".parquet") else read_numbered(path)
    return [Problem(_prompt_text(require(row, "prompt", number, path), number, path),
                    _ground_truth(row, number, path), DATASET_TASK) for number, row in rows]


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


class DatasetMathTask:
    """Scores completions to dataset rows with math-verify (no generator of its own)."""

    name = DATASET_TASK

    def __init__(self, timeout_s: float = VERIFY_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        raise BebopError(f"{DATASET_TASK} has no generator; read a file with load_dataset_rows")

    def demonstration(self, problem: Problem, rng: Any) -> str:
        return f"The answer is $\\boxed{{{problem.ground_truth}}}$."

    def score(self, problem: Problem, completion: str) -> float:
        require_math_verify()  # a missing library is a setup error, not a wrong answer
        if len(completion) > MAX_DATASET_COMPLETION_CHARS:
            return 0.0
        ok = run_with_deadline(lambda: verify_answer(problem.ground_truth, completion),
                               self.timeout_s)
        return 1.0 if ok else 0.0

    def observe(self, problem: Problem, transcript: str) -> str | None:
        return None
