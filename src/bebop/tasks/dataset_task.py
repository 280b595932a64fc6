"""A dataset file as a Task: its prompts rendered for one policy, each row scored by its reward.

    task = load_dataset_task("train.parquet", policy, reward="")            # RL: rows need a reward
    task = load_dataset_task("sft.jsonl", policy, need=COMPLETIONS)         # SFT: rows need a completion
    task = load_dataset_task("train.parquet", policy, need=PROMPTS)         # MTP self-distillation: prompts
    task.batch(index, n, seed)      # RL batch `index`: n rows, epoch after epoch, each epoch shuffled

Everything a run needs from the file is checked when it is loaded, before any rollout or step: every
row parses, every chat prompt renders with the model's template, every prompt fits the model's context,
and every row has a reward (for SFT, a completion; for MTP self-distillation, a prompt is enough).
Rows are drawn in epochs: epoch e is a permutation of the rows seeded by (seed, e), so a batch is a pure
function of (seed, index) and a resumed run draws exactly the batches it has not trained on.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
from pathlib import Path
from typing import Any

from bebop.errors import BebopError
from bebop.policy import Policy, encode_prompt
from bebop.tasks import get_task
from bebop.tasks.base import Problem, Task, check_split
from bebop.tasks.data_files import DataRow, read_data_rows
from bebop.tasks.rewards import RewardFn, absolute_spec, row_rewards, score_row

REWARDS, COMPLETIONS, PROMPTS = "rewards", "completions", "prompts"  # what a run needs of every row
MAX_REPORTED_ERRORS = 10  # reward errors printed per run; later ones are counted only


class DatasetTask:
    """Rows of a dataset file with their prompts as the policy reads them (see the module doc)."""

    def __init__(self, path: str | os.PathLike, rows: list[DataRow], prompts: list[str], *, reward: str | None = "",
                 completions: list[str] | None = None) -> None:
        """reward: a --reward spec ("" = by data_source), or None: loaded for its prompts or completions only,
        nothing is scored (self-distillation's samples score 0)."""
        self.path, self.rows, self.prompts, self.reward_spec = str(path), rows, prompts, reward
        self.completions = completions
        self.name = Path(path).name
        self.fingerprint = hashlib.sha1("\0".join(prompts).encode()).hexdigest()[:10]  # the prompts, in order
        self._index = {row.number: i for i, row in enumerate(rows)}
        self._rewards: list[RewardFn] | None = None  # loaded on first use, in each process (not pickled)
        self._order: tuple[tuple[int, int], list[int]] | None = None  # ((seed, epoch), permutation)
        self.reward_errors = 0

    def __getstate__(self) -> dict:
        """A task travels to Ray workers without its imported functions, a reward file's path made absolute
        (a worker need not share the driver's directory)."""
        spec = None if self.reward_spec is None else absolute_spec(self.reward_spec)
        return {**self.__dict__, "_rewards": None, "_order": None, "reward_spec": spec}

    @property
    def rewards(self) -> list[RewardFn]:
        if self.reward_spec is None:
            raise BebopError(f"{self.path} was loaded without a reward")
        if self._rewards is None:
            self._rewards = row_rewards(self.rows, self.reward_spec, self.path)
        return self._rewards

    def _permutation(self, seed: int, epoch: int) -> list[int]:
        if self._order is None or self._order[0] != (seed, epoch):
            self._order = ((seed, epoch), random.Random(f"data/{seed}/{epoch}").sample(range(len(self.rows)),
                                                                                      len(self.rows)))
        return self._order[1]

    def problem(self, i: int) -> Problem:
        row = self.rows[i]
        truth = "" if row.ground_truth is None else str(row.ground_truth)
        return Problem(self.prompts[i], truth, self.name, row=row.number)

    def stream(self, start: int, n: int, seed: int) -> list[Problem]:
        """Positions start .. start+n-1 of the endless stream of shuffled epochs."""
        size = len(self.rows)
        return [self.problem(self._permutation(seed, pos // size)[pos % size]) for pos in range(start, start + n)]

    def batch(self, index: int, n: int, seed: int) -> list[Problem]:
        return self.stream(index * n, n, seed)

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        """The first n of the stream: every row once (shuffled) before any repeats. The file is the split."""
        check_split(split)
        return self.stream(0, n, seed)

    def _row_index(self, problem: Problem) -> int:
        if problem.row not in self._index:
            raise BebopError(f"problem is not a row of {self.path}: {problem.prompt[:60]!r}")
        return self._index[problem.row]

    def demonstration(self, problem: Problem, rng: Any) -> str:
        if self.completions is None:
            raise BebopError(f"{self.path} was loaded for its rewards, not its completions")
        return self.completions[self._row_index(problem)]

    def score(self, problem: Problem, completion: str) -> float:
        i = self._row_index(problem)
        if self.reward_spec is None:
            return 0.0
        result = score_row(self.rewards[i], self.rows[i], completion)
        if result.error is not None:
            self._report(self.rows[i], result.error)
        return result.reward

    def _report(self, row: DataRow, error: str) -> None:
        self.reward_errors += 1
        if self.reward_errors <= MAX_REPORTED_ERRORS:
            tail = "; later reward errors are not shown" if self.reward_errors == MAX_REPORTED_ERRORS else ""
            print(f"bebop: reward error at {self.path} row {row.number}: {error} (scored 0){tail}", file=sys.stderr)

    def observe(self, problem: Problem, transcript: str) -> str | None:
        return None


def _check_prompt(policy: Policy, text: str, where: str) -> None:
    ids = encode_prompt(policy, text, where)
    context = policy.model.config.max_position_embeddings
    if len(ids) >= context:
        raise BebopError(f"{where}: the prompt is {len(ids)} tokens; the model's context is {context}")


def completion_text(policy: Policy, row: DataRow, prompt_text: str, where: str) -> str:
    """The row's demonstration as the model would write it after its prompt. Assistant messages are
    rendered with the chat template (the whole chat, minus the rendered prompt), ending before the
    end-of-sequence token if the template writes it (training appends it as a token)."""
    completion = row.completion
    if completion is None:
        raise BebopError(f"{where} has no completion ('completion', 'response', or a final assistant message)")
    if isinstance(completion, str):
        return completion
    if not isinstance(row.prompt, list):
        raise BebopError(f"{where}: a completion given as messages needs a prompt given as messages")
    whole = policy.render(row.prompt + completion, add_generation_prompt=False, what=where)
    if not whole.startswith(prompt_text):
        raise BebopError(f"{where}: the chat template renders the conversation so that it does not start with "
                         f"the rendered prompt; give the completion as text instead")
    return _strip_end_of_turn(whole[len(prompt_text):], policy)


def _strip_end_of_turn(text: str, policy: Policy) -> str:
    """The rendered completion without its final end-of-sequence token, which training appends as a token
    (bebop.encoding.encode_example). Another end-of-turn text stays as the template wrote it: a base
    Qwen3's turns end with <|im_end|> while its eos is <|endoftext|>, and it is trained on both."""
    eos = policy.codec.decode([policy.codec.eos_id]) if policy.codec.eos_id is not None else ""
    trimmed = text.rstrip()
    return trimmed[: -len(eos)] if eos and trimmed.endswith(eos) else text


def load_dataset_task(path: str | os.PathLike, policy: Policy, *, reward: str = "",
                      need: str = REWARDS) -> DatasetTask:
    """A DatasetTask with every row checked for what `need` asks (module doc); errors name file and row."""
    rows = read_data_rows(path)
    prompts: list[str] = []
    for row in rows:
        where = f"{path}: row {row.number}"
        prompts.append(policy.prompt_text(row.prompt, what=f"{where} prompt"))
        _check_prompt(policy, prompts[-1], where)
    if need == COMPLETIONS:
        completions = [completion_text(policy, row, text, f"{path}: row {row.number}")
                       for row, text in zip(rows, prompts)]
        return DatasetTask(path, rows, prompts, reward=None, completions=completions)
    if need == PROMPTS:
        return DatasetTask(path, rows, prompts, reward=None)
    task = DatasetTask(path, rows, prompts, reward=reward)
    task.rewards  # noqa: B018 -- every row has a scorer and what it needs, before any rollout
    return task


def run_task(policy: Policy, *, task: str, difficulty: int, data: str = "", reward: str = "",
             need: str = REWARDS) -> Task:
    """What a run trains on: the rows of `data` when given, else the generated task `task`."""
    if data:
        return load_dataset_task(data, policy, reward=reward, need=need)
    return get_task(task, difficulty)


__all__ = ["COMPLETIONS", "PROMPTS", "REWARDS", "DatasetTask", "load_dataset_task", "run_task"]
