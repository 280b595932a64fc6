"""The `math` task: multi-step arithmetic word problems whose worked solutions have a long tail.

A problem is a starting count (at higher difficulty often a product, "3 bags of 12 eggs")
and 1 to MAX_CHANGES gains and losses, written compactly ("Ann has 12 eggs. She buys 5,
eats 3, then finds 7. How many now?"). The completion writes out steps and ends with
`#### N`; reward is 1.0 when N is the right count, else 0.0.

Length distribution: the number of changes n is a truncated geometric on 1..MAX_CHANGES,
P(n) proportional to Level.ratio ** (n - 1) (base.long_tail_count), so most problems are
short and a few are long, like reasoning rollouts. Short problems (n <= 4) may be worked
in a compact layout; longer ones always take one line a change (~20 characters), so the
solution's length follows n. At difficulty 1, over 1000 train problems, demonstrations
are ~60 characters at p50, ~3x that at p90 and ~330 at most; a 12-change solution runs
~190-340. Prompts stay under ~160 characters, and a demonstration that would leave less
than ROOM tokens of the embedded model's 512-token context is redrawn (rare), so prompt +
solution always fit. Each line stays simple: one change of at most Level.max_change to a
running total that never drops below zero.

Demonstrations vary the order the changes are applied in (short problems only), the
layout (math_layouts: chain, one line, arrows, grouped, numbered steps, the prompt's
verbs), operator spacing, and optional opening/closing lines, so there are real choices
at many tokens.

Difficulty 1 (the default, what `bebop sft/rl --task math` use): ratio 0.75, changes of
1..9 to a start of 2..20; 2: ratio 0.82, the start may be a product; 3: ratio 0.88, changes
up to 15, the start often a product. Higher difficulty shifts the lengths longer (median
demonstration ~60 / ~80 / ~100 characters).
"""

from __future__ import annotations

import itertools
import json
import random
import re
from dataclasses import dataclass

from bebop.tasks.base import (
    DEFAULT_DIFFICULTY,
    Problem,
    check_difficulty,
    draw_split,
    load_truth,
    long_tail_count,
    score_final_answer,
    spaced,
)
from bebop.tasks.math_layouts import LAYOUTS, SHORT, Move

NAMES = (("Ann", "She"), ("Bob", "He"), ("Cat", "She"), ("Dan", "He"), ("Eve", "She"),
         ("Max", "He"), ("Sam", "He"), ("Zoe", "She"))
ITEMS = ("apples", "eggs", "pens", "cards", "coins", "books", "shells", "cups")
GAIN_VERBS = ("buys", "gets", "finds", "wins")
LOSS_VERBS = ("eats", "sells", "loses", "drops")
OPENERS = ("", "", "Steps:\n", "Let me count.\n", "Work it out:\n")
MAX_CHANGES = 12
CONTEXT_TOKENS = 512  # the embedded model's context; the tokenizer is one token a character
ROOM = 24  # tokens a demonstration leaves free after prompt + demonstration + end token
MAX_TRIES = 20  # worked solutions drawn before settling for the shortest
_MOVE = re.compile(rf"\b({'|'.join(GAIN_VERBS + LOSS_VERBS)}) (\d+)\b")


@dataclass(frozen=True)
class Level:
    ratio: float  # P(n changes) proportional to ratio ** (n - 1), n in 1..MAX_CHANGES
    max_change: int
    p_product: float  # probability the start is a product


LEVELS = {1: Level(0.75, 9, 0.0), 2: Level(0.82, 9, 0.4), 3: Level(0.88, 15, 0.6)}


@dataclass(frozen=True)
class Story:
    factors: tuple[int, int] | None  # (bags, per bag) when the start is a product
    start: int
    changes: tuple[int, ...]  # signed: +5 gains five, -3 loses three

    @property
    def answer(self) -> int:
        return self.start + sum(self.changes)


def _draw_story(rng: random.Random, difficulty: int) -> Story:
    level = LEVELS[difficulty]
    factors = None
    if rng.random() < level.p_product:
        factors = (rng.randint(2, 5), rng.randint(2, 12))
        start = factors[0] * factors[1]
    else:
        start = rng.randint(2, 20)
    total, changes = start, []
    for _ in range(long_tail_count(rng, 1, MAX_CHANGES, level.ratio)):
        k = rng.randint(1, level.max_change)
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


def _moves(problem: Problem, changes: tuple[int, ...]) -> tuple[Move, ...]:
    """The changes with the verbs the prompt tells them with ('gets'/'loses' if it does not)."""
    told = tuple((verb, int(k) if verb in GAIN_VERBS else -int(k))
                 for verb, k in _MOVE.findall(problem.prompt))
    if tuple(c for _, c in told) == changes:
        return told
    return tuple(("gets" if c > 0 else "loses", c) for c in changes)


def _order(start: int, moves: tuple[Move, ...], rng: random.Random) -> tuple[Move, ...]:
    """The order to apply the moves in: for short problems any order whose running total
    never drops below zero, for longer ones the prompt's order (easy to follow)."""
    if len(moves) > SHORT:
        return moves
    orders = sorted(order for order in set(itertools.permutations(moves))
                    if all(v >= 0 for v in itertools.accumulate((c for _, c in order),
                                                                initial=start)))
    return rng.choice(orders)


def _start_lines(story: Story, rng: random.Random, op) -> list[str]:
    if not story.factors:
        return []
    a, b = story.factors if rng.random() < 0.5 else story.factors[::-1]
    return [f"{a}{op('*')}{b}{op('=')}{story.start}"]


def _worked(story: Story, moves: tuple[Move, ...], rng: random.Random) -> str:
    """One worked solution: opener, product line, a layout's lines, closer, `#### N`."""
    op = spaced(rng)
    order = _order(story.start, moves, rng)
    body = None
    while body is None:
        body = rng.choice(LAYOUTS)(story.start, order, op)
    closers = ("", "", f"So {story.answer}.\n", f"Answer: {story.answer}\n")
    lines = _start_lines(story, rng, op) + body
    return rng.choice(OPENERS) + "\n".join(lines) + "\n" + rng.choice(closers) + \
        f"#### {story.answer}"


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
        """A worked solution that fits the context with ROOM to spare (redrawn if not)."""
        story = _story_of(problem)
        moves = _moves(problem, story.changes)
        budget = CONTEXT_TOKENS - ROOM - 1 - len(problem.prompt)
        tries = [_worked(story, moves, rng)]
        while len(tries[-1]) > budget and len(tries) < MAX_TRIES:
            tries.append(_worked(story, moves, rng))
        return min(tries, key=len)  # the one that fits, else the shortest

    def score(self, problem: Problem, completion: str) -> float:
        return score_final_answer(completion, load_truth(problem, ("answer",))["answer"])

    def observe(self, problem: Problem, transcript: str) -> str | None:
        return None


def _story_of(problem: Problem) -> Story:
    data = load_truth(problem, ("start", "factors", "changes"))
    factors = tuple(data["factors"]) if data["factors"] else None
    return Story(factors, data["start"], tuple(data["changes"]))
