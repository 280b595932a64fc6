"""The `code` task: write a program in bebop's tiny language (code_lang) for a function of x.

The prompt describes f as a chain of steps ("take x, times 3, then add 4") with one worked
example; the completion is the program. Reward is ALL-OR-NOTHING: 1.0 only if the program
returns the right value on every hidden test input, else 0.0 (a syntax error, a runtime
error or hitting the step/time limit scores 0). All-or-nothing keeps the reward binary like
the other tasks, so partly-right programs do not farm reward.

Demonstrations vary: one `ret` expression or several assignments, commuted operands, the
variable name, `rep` loops in place of small additions and multiplications, spacing, and
newline or ';' separators.

Length distribution: the number of steps is a truncated geometric (base.long_tail_count):
most functions take 1-2 steps, a few take up to MAX_STEPS, so programs have a long tail
too (at most ~150 characters). Multiplications are swapped for additions where a value
would pass MAX_VALUE on a hidden input, so every program runs well inside code_lang's limits.

Difficulty 1 (the default): 1-8 steps, P(n) proportional to 0.6 ** (n - 1); 2: 2-8 steps,
0.7; 3: 2-8 steps, 0.75, which may include "square it".
"""

from __future__ import annotations

import json
import random

from bebop.tasks.base import (
    DEFAULT_DIFFICULTY,
    MAX_COMPLETION_CHARS,
    Problem,
    check_difficulty,
    draw_split,
    load_truth,
    long_tail_count,
    spaced,
)
from bebop.tasks.code_lang import CodeError, parse_program, run_program

Op = tuple[str, int]  # ("add" | "sub" | "mul" | "sq", constant)
HIDDEN_INPUTS = (0, 1, 3, 6, 10)
EXAMPLE_INPUTS = (1, 2, 3, 4, 5)  # the prompt's worked example f(x) uses one of these
MAX_STEPS = 8
MAX_VALUE = 10**6  # the largest magnitude a drawn function reaches on any input above
VARS = ("y", "y", "a", "n", "r", "v", "x")
TEMPS = ("t", "s", "k")
WORDS = {"add": "add {}", "sub": "subtract {}", "mul": "times {}", "sq": "square it"}
SYMBOL = {"add": "+", "sub": "-", "mul": "*"}

# difficulty -> (min steps, long-tail ratio of the step count, allowed ops)
LEVELS = {1: (1, 0.6, ("add", "sub", "mul")), 2: (2, 0.7, ("add", "sub", "mul")),
          3: (2, 0.75, ("add", "sub", "mul", "sq"))}


def apply_ops(ops: list[Op], x: int) -> int:
    for kind, k in ops:
        x = {"add": x + k, "sub": x - k, "mul": x * k, "sq": x * x}[kind]
    return x


def _in_range(ops: list[Op]) -> bool:
    return all(abs(apply_ops(ops, x)) <= MAX_VALUE for x in HIDDEN_INPUTS + EXAMPLE_INPUTS)


def _draw_ops(rng: random.Random, difficulty: int) -> list[Op]:
    lo, ratio, kinds = LEVELS[difficulty]
    ops: list[Op] = []
    for _ in range(long_tail_count(rng, lo, MAX_STEPS, ratio)):
        kind = rng.choice([k for k in kinds if not (ops and k == "sq" == ops[-1][0])])
        step = (kind, rng.randint(2, 5) if kind == "mul" else 0 if kind == "sq" else
                rng.randint(1, 9))
        if not _in_range(ops + [step]):  # growing past MAX_VALUE: add instead
            step = ("add", rng.randint(1, 9))
        ops.append(step)
    return ops


def _prompt(ops: list[Op], example: int) -> str:
    words = [WORDS[kind].format(k) for kind, k in ops]
    steps = ", ".join(words[:-1]) + f", then {words[-1]}" if len(words) > 1 else words[0]
    return f"f(x): take x, {steps}.\nf({example})={apply_ops(ops, example)}\n"


def _expr(ops: list[Op], base: str, rng: random.Random, op) -> str:
    """One expression applying `ops` to the variable `base`, operands commuted at random."""
    text, is_sum = base, False  # is_sum: the text's top operator is + or -
    for kind, k in ops:
        if kind in ("add", "sub"):
            swap = kind == "add" and rng.random() < 0.3
            text = f"{k}{op('+')}{text}" if swap else f"{text}{op(SYMBOL[kind])}{k}"
            is_sum = True
            continue
        inner = f"({text})" if is_sum else text
        if kind == "sq":
            text = f"{inner}{op('*')}{inner}"
        else:
            text = f"{k}{op('*')}{inner}" if rng.random() < 0.4 else f"{inner}{op('*')}{k}"
        is_sum = False
    return text


def _loop(v: str, kind: str, k: int, rng: random.Random, op, sep: str) -> str | None:
    """A `rep` loop doing one step on v, where the step is small enough to loop."""
    if kind in ("add", "sub") and k <= 4:
        return f"rep {k} {{{v}{op('=')}{v}{op(SYMBOL[kind])}1}}"
    if kind == "mul":
        t = rng.choice([t for t in TEMPS if t != v])
        return f"{t}{op('=')}{v}{sep}rep {k - 1} {{{v}{op('=')}{v}{op('+')}{t}}}"
    return None


def _segments(ops: list[Op], rng: random.Random) -> list[list[Op]]:
    """Split the steps into consecutive groups, each computed by one statement."""
    groups, current = [], []
    for step in ops:
        current.append(step)
        if rng.random() < 0.5:
            groups.append(current)
            current = []
    return groups + [current] if current else groups


def _program(ops: list[Op], rng: random.Random) -> str:
    op, sep = spaced(rng), rng.choice(("\n", "\n", "; "))
    v = rng.choice(VARS)
    lines, cur = [], "x"
    if v != "x" and rng.random() < 0.25:
        lines.append(f"{v}{op('=')}x")
        cur = v
    groups = _segments(ops, rng)
    for i, group in enumerate(groups):
        if i == len(groups) - 1 and rng.random() < 0.5:
            return sep.join(lines + [f"ret {_expr(group, cur, rng, op)}"])
        loop = _loop(v, *group[0], rng, op, sep) if len(group) == 1 and cur == v else None
        lines.append(loop if loop and rng.random() < 0.5 else f"{v}{op('=')}{_expr(group, cur, rng, op)}")
        cur = v
    return sep.join(lines + [f"ret {v}"])


class CodeTask:
    name = "code"

    def __init__(self, difficulty: int = DEFAULT_DIFFICULTY) -> None:
        self.difficulty = check_difficulty(difficulty)

    def _draw(self, rng: random.Random) -> tuple[str, Problem]:
        ops = _draw_ops(rng, self.difficulty)
        example = rng.choice(EXAMPLE_INPUTS)
        tests = [[x, apply_ops(ops, x)] for x in HIDDEN_INPUTS]
        truth = json.dumps({"ops": ops, "tests": tests}, separators=(",", ":"))
        return json.dumps(ops), Problem(_prompt(ops, example), truth, self.name)

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        return draw_split(self.name, self._draw, split, n, seed)

    def demonstration(self, problem: Problem, rng: random.Random) -> str:
        ops = [tuple(step) for step in load_truth(problem, ("ops",))["ops"]]
        return _program(ops, rng)

    def score(self, problem: Problem, completion: str) -> float:
        if len(completion) > MAX_COMPLETION_CHARS:
            return 0.0
        tests = load_truth(problem, ("tests",))["tests"]
        try:
            program = parse_program(completion)
            passed = all(run_program(program, x) == y for x, y in tests)
        except CodeError:
            return 0.0
        return 1.0 if passed else 0.0

    def observe(self, problem: Problem, transcript: str) -> str | None:
        return None
