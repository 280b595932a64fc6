"""What every verifiable task shares: the `Problem` record, the `Task` protocol, the
hash-based train/test split, and parsing of the final `#### N` answer line.

Train and test are disjoint by construction: a problem's split is a hash of its canonical
form (the arithmetic behind a word problem, a program's spec, ...), so the same problem
can never be drawn into both splits, whatever the seed.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from bebop.errors import BebopError

SPLITS = ("train", "test")
TEST_PERCENT = 20  # share of the canonical-problem space that is held out for test
MAX_COMPLETION_CHARS = 4096  # our tasks' completions are at most ~350 chars; longer ones score 0
DEFAULT_DIFFICULTY = 1
DIFFICULTIES = (1, 2, 3)

_FINAL_ANSWER = re.compile(r"####[ \t]*(-?\d{1,12})\s*$")


@dataclass(frozen=True)
class Problem:
    prompt: str  # text fed to the model; the completion starts right after it
    ground_truth: str  # what the reward checks against (a string; JSON if structured)
    task: str  # task name
    row: int = 0  # a dataset problem's 1-based row in its file (bebop.tasks.dataset_task); 0 = generated


class Task(Protocol):
    name: str

    def problems(self, split: str, n: int, seed: int) -> list[Problem]: ...

    def demonstration(self, problem: Problem, rng: random.Random) -> str: ...

    def score(self, problem: Problem, completion: str) -> float: ...

    def observe(self, problem: Problem, transcript: str) -> str | None: ...


def split_of(canonical: str) -> str:
    """'test' for a fixed TEST_PERCENT of canonical forms, 'train' for the rest."""
    digest = hashlib.sha256(canonical.encode("utf-8")).digest()
    return "test" if int.from_bytes(digest[:8], "big") % 100 < TEST_PERCENT else "train"


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise BebopError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")


def check_difficulty(difficulty: int) -> int:
    if difficulty not in DIFFICULTIES:
        raise BebopError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}")
    return difficulty


Draw = Callable[[random.Random], tuple[str, Problem]]  # -> (canonical form, problem)


def draw_split(task: str, draw: Draw, split: str, n: int, seed: int) -> list[Problem]:
    """Draw problems until `n` fall in `split`; deterministic given (task, split, seed)."""
    check_split(split)
    if n < 0:
        raise BebopError(f"number of problems must be >= 0, got {n}")
    rng = random.Random(f"{task}/{split}/{seed}")
    out: list[Problem] = []
    for _ in range(200 * n + 1000):
        if len(out) == n:
            return out
        canonical, problem = draw(rng)
        if split_of(canonical) == split:
            out.append(problem)
    if len(out) == n:
        return out
    raise BebopError(f"task {task} could not draw {n} {split} problems; raise the difficulty")


def load_truth(problem: Problem, keys: tuple[str, ...]) -> dict:
    """The problem's ground truth as a JSON object holding `keys`, else a BebopError."""
    try:
        truth = json.loads(problem.ground_truth)
    except (json.JSONDecodeError, TypeError):
        truth = None
    if not isinstance(truth, dict) or any(key not in truth for key in keys):
        raise BebopError(f"ground truth {problem.ground_truth[:60]!r} is not a {problem.task} "
                         f"task's (a JSON object with {', '.join(keys)})")
    return truth


def final_answer(text: str) -> int | None:
    """The integer N of a text that ends with the line `#### N`, else None."""
    if len(text) > MAX_COMPLETION_CHARS:
        return None
    match = _FINAL_ANSWER.search(text)
    return int(match.group(1)) if match else None


def score_final_answer(completion: str, expected: int) -> float:
    return 1.0 if final_answer(completion) == expected else 0.0


def long_tail_count(rng: random.Random, lo: int, hi: int, ratio: float) -> int:
    """A count in lo..hi with P(n) proportional to ratio ** (n - lo): a truncated geometric.

    With ratio < 1 most draws are small and a few are large -- the long tail of response
    lengths that real reasoning rollouts have. Uses one rng.random() call.
    """
    if not (lo <= hi and 0 < ratio):
        raise BebopError(f"long-tail count needs lo <= hi and ratio > 0, got {lo}, {hi}, {ratio}")
    counts = range(lo, hi + 1)
    return rng.choices(counts, weights=[ratio ** (n - lo) for n in counts])[0]


def spaced(rng: random.Random) -> Callable[[str], str]:
    """Pick, once per demonstration, whether operators get spaces: returns op -> text."""
    if rng.random() < 0.5:
        return lambda op: op
    return lambda op: f" {op} "
