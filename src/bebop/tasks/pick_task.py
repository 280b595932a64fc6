"""The `pick` task: name N distinct numbers of a kind from a range, then their sum.

    prompt:         Pick 5 distinct even numbers from 12 to 87. List them, then their sum.
    demonstration:  36, 12 80,58
                    64
                    #### 250

Every other task has essentially one correct answer a problem, so a policy fine-tuned on its
demonstrations ends up nearly deterministic (0.2-0.6 nats a token). Here many answers are
right, which gives draft-head studies a target with real entropy: a demonstration draws its N
numbers uniformly without replacement from the qualifying ones, in random order, and joins
each pair with a separator drawn uniformly from SEPARATORS. Its digits and separators carry
all the entropy; only the sum line (`#### S`, S forced by the numbers) and the end token are
determined. Exactly (`demonstration_nats` over the mean length in tokens, end token counted),
that is ~0.96 nats a token at difficulty 1, ~1.03 at 2 and ~1.08 at 3.

The reward stays exact: 1.0 iff the completion is N distinct numbers, each in the range and
of the kind, separated as in SEPARATORS, then a last line `#### S` with S their sum; else 0.0.

A problem is (N, lo, hi, kind): lo in 1..20, hi in 70..99, kind one of KINDS (every number,
even, odd, multiples of 3), so at least 17 numbers qualify. Difficulty sets N: 5, 6 or 7
(longer sums, a little more entropy); demonstrations are 17-35 characters. That is 2,400
canonical problems a difficulty, ~480 of them in the test split.
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass

from bebop.errors import BebopError
from bebop.tasks.base import DEFAULT_DIFFICULTY, Problem, check_difficulty, draw_split, final_answer, load_truth

COUNTS = {1: 5, 2: 6, 3: 7}  # numbers to pick, by difficulty
LO_RANGE = (1, 20)  # the range's lower end is drawn from here ...
HI_RANGE = (70, 99)  # ... and its upper end from here
KINDS = {(1, 0): "numbers", (2, 0): "even numbers", (2, 1): "odd numbers", (3, 0): "multiples of 3"}  # x % mod == rem
SEPARATORS = (", ", ",", " ", "\n")  # between two numbers, each drawn uniformly
_NUMBER = r"[1-9]\d{0,5}"
_ANSWER = re.compile(rf"\s*({_NUMBER}(?:(?:, ?| |\n){_NUMBER})*)[ \t]*\n####[ \t]*-?\d{{1,12}}\s*")
_KEYS = ("n", "lo", "hi", "mod", "rem")


@dataclass(frozen=True)
class Spec:
    n: int  # how many numbers to pick
    lo: int  # the range, both ends included
    hi: int
    mod: int  # the kind: numbers x with x % mod == rem
    rem: int

    def members(self) -> list[int]:
        return [x for x in range(self.lo, self.hi + 1) if x % self.mod == self.rem]

    def accepts(self, numbers: list[int]) -> bool:
        """Exactly n distinct numbers, each in the range and of the kind."""
        return len(numbers) == self.n == len(set(numbers)) and \
            all(self.lo <= x <= self.hi and x % self.mod == self.rem for x in numbers)


def _prompt(spec: Spec) -> str:
    kind = KINDS[(spec.mod, spec.rem)]
    return f"Pick {spec.n} distinct {kind} from {spec.lo} to {spec.hi}. List them, then their sum.\n"


def _spec_of(problem: Problem) -> Spec:
    truth = load_truth(problem, _KEYS)
    spec = Spec(*(truth[key] for key in _KEYS))
    if (spec.mod, spec.rem) not in KINDS or len(spec.members()) < spec.n:
        raise BebopError(f"ground truth {problem.ground_truth[:60]!r} is not a pick task's (unknown kind, or "
                         f"fewer than n numbers qualify)")
    return spec


def listed(completion: str) -> list[int] | None:
    """The numbers a completion lists before its final `#### S` line, else None (any other text)."""
    if final_answer(completion) is None:  # also refuses over-long completions, before the regex runs
        return None
    match = _ANSWER.fullmatch(completion)
    return [int(x) for x in re.findall(r"\d+", match.group(1))] if match else None


def demonstration_nats(problem: Problem) -> float:
    """The entropy of a problem's demonstrations in nats: the ordered draw of n distinct members,
    ln(M! / (M - n)!), plus ln(len(SEPARATORS)) for each of the n - 1 separators. (The text
    decodes back to the numbers and separators, so this is the entropy of the text itself.)"""
    spec = _spec_of(problem)
    members = len(spec.members())
    return sum(math.log(members - i) for i in range(spec.n)) + (spec.n - 1) * math.log(len(SEPARATORS))


class PickTask:
    name = "pick"

    def __init__(self, difficulty: int = DEFAULT_DIFFICULTY) -> None:
        self.difficulty = check_difficulty(difficulty)

    def _draw(self, rng: random.Random) -> tuple[str, Problem]:
        (mod, rem) = rng.choice(sorted(KINDS))
        spec = Spec(COUNTS[self.difficulty], rng.randint(*LO_RANGE), rng.randint(*HI_RANGE), mod, rem)
        canonical = json.dumps([spec.n, spec.lo, spec.hi, spec.mod, spec.rem])
        truth = json.dumps({key: getattr(spec, key) for key in _KEYS})
        return canonical, Problem(_prompt(spec), truth, self.name)

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        return draw_split(self.name, self._draw, split, n, seed)

    def demonstration(self, problem: Problem, rng: random.Random) -> str:
        """n members in random order, each pair joined by a random separator, then `#### sum`."""
        spec = _spec_of(problem)
        picked = rng.sample(spec.members(), spec.n)
        listing = str(picked[0]) + "".join(rng.choice(SEPARATORS) + str(x) for x in picked[1:])
        return f"{listing}\n#### {sum(picked)}"

    def score(self, problem: Problem, completion: str) -> float:
        spec = _spec_of(problem)
        numbers = listed(completion)
        ok = numbers is not None and spec.accepts(numbers) and final_answer(completion) == sum(numbers)
        return 1.0 if ok else 0.0

    def observe(self, problem: Problem, transcript: str) -> str | None:
        return None
