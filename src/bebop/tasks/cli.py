"""The `bebop tasks` command: sample problems with reference completions, score completions.

    bebop tasks sample --task NAME --n N [--seed S] [--split train|test] [--difficulty D]
        JSONL on stdout: prompt, reference (a correct completion), ground_truth, task
    bebop tasks score --task NAME FILE.jsonl
        reads rows with prompt, completion, ground_truth (and task, needed for mix);
        writes the same rows plus `reward`, JSONL on stdout
"""

from __future__ import annotations

import argparse
import json
import random
import sys

from bebop.jsonl import read_numbered
from bebop.tasks import DATASET_TASK, TASK_LIST, get_task
from bebop.tasks.base import DEFAULT_DIFFICULTY, DIFFICULTIES, SPLITS, Problem
from bebop.tasks.data_files import require

DIFFICULTY_HELP = "1 (easiest) .. 3"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("tasks", help="sample and score verifiable tasks")
    commands = parser.add_subparsers(dest="tasks_command", required=True)

    sample = commands.add_parser("sample", help="problems with reference completions, as JSONL")
    sample.add_argument("--task", required=True, help=TASK_LIST)
    sample.add_argument("--n", type=int, required=True, help="how many problems")
    sample.add_argument("--seed", type=int, default=0, help="seeds the problems and their references")
    sample.add_argument("--split", choices=SPLITS, default="train", help="the train or the test problems (disjoint)")
    sample.add_argument("--difficulty", type=int, choices=DIFFICULTIES, default=DEFAULT_DIFFICULTY,
                        help=DIFFICULTY_HELP)
    sample.set_defaults(func=cmd_sample)

    score = commands.add_parser("score", help="add a reward to each row of a JSONL file")
    score.add_argument("--task", required=True,
                       help=f"{TASK_LIST}, or {DATASET_TASK} (a math answer checked by math-verify)")
    score.add_argument("--difficulty", type=int, choices=DIFFICULTIES, default=DEFAULT_DIFFICULTY, help=DIFFICULTY_HELP)
    score.add_argument("file", help="JSONL rows with prompt, completion and ground_truth (and task, for mix)")
    score.set_defaults(func=cmd_score)


def _write(row: dict) -> None:
    sys.stdout.write(json.dumps(row) + "\n")


def cmd_sample(args: argparse.Namespace) -> None:
    task = get_task(args.task, getattr(args, "difficulty", DEFAULT_DIFFICULTY))
    rng = random.Random(f"reference/{args.seed}")
    for problem in task.problems(args.split, args.n, args.seed):
        _write({"prompt": problem.prompt, "reference": task.demonstration(problem, rng),
                "ground_truth": problem.ground_truth, "task": problem.task})


def cmd_score(args: argparse.Namespace) -> None:
    task = get_task(args.task, getattr(args, "difficulty", DEFAULT_DIFFICULTY))
    rows = read_numbered(args.file)
    problems = [_problem(row, number, args) for number, row in rows]  # check all rows first
    for (number, row), problem in zip(rows, problems):
        _write(row | {"reward": task.score(problem, str(row["completion"]))})


def _problem(row: dict, number: int, args: argparse.Namespace) -> Problem:
    for key in ("prompt", "completion", "ground_truth"):
        require(row, key, number, args.file)
    name = require(row, "task", number, args.file) if args.task == "mix" else args.task
    return Problem(str(row["prompt"]), str(row["ground_truth"]), str(name))
