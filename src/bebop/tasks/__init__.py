"""Verifiable tasks for RL: a registry of generators, prompt formats and reward functions.

    get_task("math" | "code" | "agent" | "mix" | "pick")  -> a Task (see base.Task)
    get_task("math_dataset")                     -> scores completions with math-verify
    dataset_task.load_dataset_task(path, policy) -> a task over your own JSONL / parquet rows
"""

from __future__ import annotations

from collections.abc import Callable

from bebop.errors import BebopError
from bebop.tasks.agent_task import AgentTask
from bebop.tasks.base import DEFAULT_DIFFICULTY, Problem, Task
from bebop.tasks.code_task import CodeTask
from bebop.tasks.math_answers import DATASET_TASK, DatasetMathTask
from bebop.tasks.math_task import MathTask
from bebop.tasks.mix import MixTask
from bebop.tasks.pick_task import PickTask

TASK_NAMES: tuple[str, ...] = ("math", "code", "agent", "mix", "pick")
TASK_LIST = f"{', '.join(TASK_NAMES[:-1])} or {TASK_NAMES[-1]}"  # what every --task help names
MIX_PARTS = ("math", "code", "agent")
_GENERATED: dict[str, Callable[[int], Task]] = {"math": MathTask, "code": CodeTask, "agent": AgentTask,
                                               "pick": PickTask}


def get_task(name: str, difficulty: int = DEFAULT_DIFFICULTY) -> Task:
    """The task called `name`; `difficulty` (1 easiest .. 3) tunes the generated tasks."""
    if name in _GENERATED:
        return _GENERATED[name](difficulty)
    if name == "mix":
        return MixTask(MIX_PARTS, lambda part: get_task(part, difficulty))
    if name == DATASET_TASK:
        return DatasetMathTask()
    known = ", ".join(TASK_NAMES)  # the tasks a user names; DATASET_TASK scores --data rows
    raise BebopError(f"unknown task {name!r}; known tasks: {known}")


__all__ = ["TASK_LIST", "TASK_NAMES", "DATASET_TASK", "Problem", "Task", "get_task"]
