"""The `mix` task: problems drawn from several tasks, each scored by its own task.

`problems` picks, deterministically from the seed, which task each of the n slots comes
from, asks each task for that many problems of the split, and interleaves them in slot
order. `demonstration`, `score` and `observe` dispatch on `problem.task`.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from bebop.tasks.base import Problem, Task, check_split


class MixTask:
    name = "mix"

    def __init__(self, parts: tuple[str, ...], resolve: Callable[[str], Task]) -> None:
        self.parts = parts
        self._resolve = resolve

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        check_split(split)
        rng = random.Random(f"mix/{split}/{seed}")
        slots = [rng.choice(self.parts) for _ in range(n)]
        drawn = {name: iter(self._resolve(name).problems(split, slots.count(name), seed))
                 for name in self.parts}
        return [next(drawn[name]) for name in slots]

    def _task_of(self, problem: Problem) -> Task:
        return self._resolve(problem.task)

    def demonstration(self, problem: Problem, rng: random.Random) -> str:
        return self._task_of(problem).demonstration(problem, rng)

    def score(self, problem: Problem, completion: str) -> float:
        return self._task_of(problem).score(problem, completion)

    def observe(self, problem: Problem, transcript: str) -> str | None:
        return self._task_of(problem).observe(problem, transcript)
