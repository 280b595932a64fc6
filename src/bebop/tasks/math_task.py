"""The `math` task: short multi-step arithmetic word problems.

A problem is a starting count (at higher difficulty a product, "3 bags of 12 eggs") and
a few gains and losses. The completion writes out steps and ends with `#### N`; reward is
1.0 when N is the right count, else 0.0. Demonstrations vary the order the changes are
applied in, the layout (one step a line, one line, gains and losses grouped, words),
spacing, and optional opening/closing lines, so there are real choices at many tokens.

Difficulty 1: 2 changes of 1..9 to a start of 2..20; 2: 3 changes, start may be a
product; 3: 4 changes of up to 19, start often a product.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass

from bebop.tasks.base import (DEFAULT_DIFFICULTY, Problem, check_difficulty, draw_split,
                              load_truth, score_final_answer, spaced)

NAMES = (("Ann", "She"), ("Bob", "He"), ("Cat", "She"), ("Dan", "He"), ("Eve", "She"),
         ("Max", "He"), ("Sam", "He"), ("Zoe", "She"))
ITEMS = ("apples", "eggs", "pens", "cards", "coins", "books", "shells", "cups")
GAIN_VERBS = ("buys", "gets", "finds", "wins")
LOSS_VERBS = ("eats", "sells", "loses", "drops")
OPENERS = ("", "", "Steps:\n", "Let me count.\n", "Work it out:\n")

# difficulty -> (number of changes, max change, probability the start is a product)
LEVELS = {1: (2, 9, 0.0), 2: (3, 9, 0.4), 3: (4, 19, 0.6)}


@dataclass(frozen=True)
class Story:
    factors: tuple[int, int] | None  # (bags, per bag) when the start is a product
    start: int
    changes: tuple[int, ...]  # signed: +5 gains five, -3 loses three

    @property
    def answer(self) -> int:
        return self.start + sum(self.changes)


def _draw_story(rng: random.Random, difficulty: int) -> Story:
    n_changes, max_change, p_product = LEVELS[difficulty]
    factors = None
    if rng.random() < p_product:
        factors = (rng.randint(2, 5), rng.randint(2, 12))
        start = factors[0] * factors[1]
    else:
        start = rng.randint(2, 20)
    total, changes = start, []
    for _ in range(n_changes):
        k = rng.randint(1, max_change)
        sign = -1 if (k <= total and rng.random() < 0.5) else 1
        changes.append(sign * k)
        total += sign * k
    return Story(factors, start, tuple(changes))


def _prompt(story: Story, rng: random.Random) -> str:
    name, pronoun = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    if story.factors:
        have = f"{name} has {story.factors[0]} bags of {story.factors[1]} {item}."
    else:
        have = f"{name} has {story.start} {item}."
    verbs = [f"{rng.choice(GAIN_VERBS if c > 0 else LOSS_VERBS)} {abs(c)}" for c in story.changes]
    acts = ", ".join(verbs[:-1]) + f", then {verbs[-1]}" if len(verbs) > 1 else verbs[0]
    return f"{have} {pronoun} {acts}. How many now?\n"


def _nonnegative_orders(start: int, changes: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every order of the changes whose running total never drops below zero."""
    orders = []
    for order in set(itertools.permutations(changes)):
        running = itertools.accumulate(order, initial=start)
        if all(v >= 0 for v in running):
            orders.append(order)
    return sorted(orders)


def _signed(c: int) -> str:
    return f"+{c}" if c > 0 else f"-{-c}"


def _start_lines(story: Story, rng: random.Random, op) -> list[str]:
    if not story.factors:
        return []
    a, b = story.factors if rng.random() < 0.5 else story.factors[::-1]
    return [f"{a}{op('*')}{b}{op('=')}{story.start}"]


def _chain(start: int, order: tuple[int, ...], op) -> list[str]:
    lines, total = [], start
    for c in order:
        lines.append(f"{total}{op(_signed(c)[0])}{abs(c)}{op('=')}{total + c}")
        total += c
    return lines


def _one_line(start: int, order: tuple[int, ...], op) -> list[str]:
    terms = "".join(f"{op(_signed(c)[0])}{abs(c)}" for c in order)
    return [f"{start}{terms}{op('=')}{start + sum(order)}"]


def _arrows(start: int, order: tuple[int, ...], op) -> list[str]:
    parts, total = [f"Start {start}."], start
    for c in order:
        total += c
        parts.append(f"{_signed(c)} is {total}.")
    return [" ".join(parts)]


def _grouped(start: int, order: tuple[int, ...], op) -> list[str] | None:
    gains = [c for c in order if c > 0]
    losses = [-c for c in order if c < 0]
    if not gains or not losses or start + sum(gains) - sum(losses) < 0:
        return None
    lines = []
    for label, group in (("Gain", gains), ("Loss", losses)):
        if len(group) > 1:
            lines.append(f"{label}: {op('+').join(map(str, group))}{op('=')}{sum(group)}")
    up = start + sum(gains)
    lines.append(f"{start}{op('+')}{sum(gains)}{op('=')}{up}")
    lines.append(f"{up}{op('-')}{sum(losses)}{op('=')}{up - sum(losses)}")
    return lines


LAYOUTS = (_chain, _chain, _one_line, _arrows, _grouped)


class MathTask:
    name = "math"

    def __init__(self, difficulty: int = DEFAULT_DIFFICULTY) -> None:
        self.difficulty = check_difficulty(difficulty)

    def _draw(self, rng: random.Random) -> tuple[str, Problem]:
        story = _draw_story(rng, self.difficulty)
        canonical = json.dumps([story.factors, story.start, story.changes])
        truth = json.dumps({"start": story.start, "factors": story.factors,
                            "changes": story.changes, "answer": story.answer})
        return canonical, Problem(_prompt(story, rng), truth, self.name)

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        return draw_split(self.name, self._draw, split, n, seed)

    def demonstration(self, problem: Problem, rng: random.Random) -> str:
        story = _story_of(problem)
        op = spaced(rng)
        order = rng.choice(_nonnegative_orders(story.start, story.changes))
        body = None
        while body is None:
            body = rng.choice(LAYOUTS)(story.start, order, op)
        closers = ("", "", f"So {story.answer}.\n", f"Answer: {story.answer}\n")
        lines = _start_lines(story, rng, op) + body
        return rng.choice(OPENERS) + "\n".join(lines) + "\n" + rng.choice(closers) + \
            f"#### {story.answer}"

    def score(self, problem: Problem, completion: str) -> float:
        return score_final_answer(completion, load_truth(problem, ("answer",))["answer"])

    def observe(self, problem: Problem, transcript: str) -> str | None:
        return None


def _story_of(problem: Problem) -> Story:
    data = load_truth(problem, ("start", "factors", "changes"))
    factors = tuple(data["factors"]) if data["factors"] else None
    return Story(factors, data["start"], tuple(data["changes"]))
