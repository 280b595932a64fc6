"""The pick task: exact rewards, disjoint splits, and demonstrations whose entropy is real.

The entropy checks measure 20,000 demonstrations of one problem. Counting the next character
after each prefix (the plug-in estimate) is biased low here: a demonstration has ~e^24 equally
likely texts, so past the second number nearly every prefix is seen once and counts as
certain. It still bounds the entropy from below, and the per-slot counts (first number, first
two numbers, each separator) are accurate, so together they check `demonstration_nats`.
"""

import json
import math
import random
from collections import Counter, defaultdict

import pytest

from bebop.errors import BebopError
from bebop.tasks import get_task
from bebop.tasks.base import DIFFICULTIES, Problem
from bebop.tasks.pick_task import SEPARATORS, demonstration_nats, listed
from bebop.tokenizer import ALPHABET

PROBLEM = Problem("Pick 5 distinct even numbers from 10 to 98. List them, then their sum.\n",
                  json.dumps({"n": 5, "lo": 10, "hi": 98, "mod": 2, "rem": 0}), "pick")
MEMBERS = 45  # the even numbers 10..98
TASK = get_task("pick")
SAMPLES = 20_000


@pytest.fixture(scope="module")
def demos() -> list[str]:
    rng = random.Random(0)
    return [TASK.demonstration(PROBLEM, rng) for _ in range(SAMPLES)]


def test_prompt_names_the_count_kind_and_range():
    for difficulty, n in zip(DIFFICULTIES, (5, 6, 7)):
        for problem in get_task("pick", difficulty).problems("train", 20, seed=0):
            truth = json.loads(problem.ground_truth)
            assert problem.task == "pick" and truth["n"] == n
            assert problem.prompt.startswith(f"Pick {n} distinct ")
            assert f" from {truth['lo']} to {truth['hi']}. List them, then their sum.\n" in problem.prompt


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_demonstrations_always_score_one(difficulty):
    task, rng = get_task("pick", difficulty), random.Random(difficulty)
    for split in ("train", "test"):
        for problem in task.problems(split, 150, seed=1):
            for _ in range(10):
                demo = task.demonstration(problem, rng)
                assert task.score(problem, demo) == 1.0, (problem.prompt, demo)
                assert set(problem.prompt + demo) <= set(ALPHABET) and len(demo) <= 35, demo


def test_correct_completions_score_one():
    for completion in ("12, 14, 16, 18, 20\n#### 80", "20,18 16\n14\n12\n#### 80", "98 10 50 52 54\n####264",
                       "12, 14, 16, 18, 20 \n#### 80\n", "\n10,12,14,16,98\n#### 150"):
        assert TASK.score(PROBLEM, completion) == 1.0, completion


@pytest.mark.parametrize("completion", [
    "12, 14, 16, 18, 20\n#### 81",          # wrong sum
    "12, 14, 16, 18, 18\n#### 78",          # a duplicate
    "8, 14, 16, 18, 20\n#### 76",           # below the range
    "12, 14, 16, 18, 100\n#### 160",        # above the range
    "12, 14, 16, 18, 21\n#### 81",          # odd
    "12, 14, 16, 18\n#### 60",              # too few
    "12, 14, 16, 18, 20, 22\n#### 102",     # too many
    "12, 14, 16, 18, 20 #### 80",           # the sum not on its own line
    "12, 14, 16, 18, 20\n#### 80\nthanks",  # the sum not last
    "12, 14, 16, 18, 20",                   # no sum
    "Numbers: 12, 14, 16, 18, 20\n#### 80",  # other text
    "12; 14; 16; 18; 20\n#### 80",          # a separator not in SEPARATORS
    "012, 14, 16, 18, 20\n#### 80",         # a leading zero
    "12,, 14, 16, 18, 20\n#### 80",
    "#### 80", "", "   ", "garbage", "\x00\xff",
])
def test_wrong_completions_score_zero(completion):
    assert TASK.score(PROBLEM, completion) == 0.0


def test_listed_reads_the_numbers():
    assert listed("36, 12 80,58\n64\n#### 250") == [36, 12, 80, 58, 64]
    assert listed("36, 12 80,58\n64") is None
    assert listed("1 " * 3000 + "\n#### 3000") is None  # past MAX_COMPLETION_CHARS


def test_bad_ground_truth_is_a_bebop_error():
    bad = Problem("p", json.dumps({"n": 5, "lo": 10, "hi": 98, "mod": 7, "rem": 0}), "pick")
    too_few = Problem("p", json.dumps({"n": 5, "lo": 10, "hi": 13, "mod": 1, "rem": 0}), "pick")
    for problem in (bad, too_few, Problem("p", "[5, 10]", "pick")):
        with pytest.raises(BebopError, match="ground truth"):
            TASK.score(problem, "#### 1")


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_train_and_test_are_disjoint_and_test_is_large(difficulty):
    task = get_task("pick", difficulty)
    train = {p.ground_truth for p in task.problems("train", 2000, seed=0)}
    test = {p.ground_truth for p in task.problems("test", 2000, seed=0)}
    assert not train & test
    assert len(test) >= 300, len(test)  # ~480 of the 2,400 problems are held out


def test_problems_and_demonstrations_are_deterministic():
    assert TASK.problems("train", 30, seed=4) == get_task("pick").problems("train", 30, seed=4)
    assert TASK.problems("train", 30, seed=4) != TASK.problems("train", 30, seed=5)
    assert TASK.demonstration(PROBLEM, random.Random(3)) == TASK.demonstration(PROBLEM, random.Random(3))


def test_demonstrations_of_one_problem_vary(demos):
    assert len(set(demos)) >= SAMPLES - 5  # ~e^24 equally likely texts: repeats are all but impossible
    firsts = Counter(listed(d)[0] for d in demos)
    assert len(firsts) == MEMBERS
    assert {sep for sep in SEPARATORS if any(sep in d.split("\n####")[0] for d in demos)} == set(SEPARATORS)


def _plugin_nats(counts: Counter) -> float:
    total = sum(counts.values())
    return -sum(k / total * math.log(k / total) for k in counts.values())


def test_each_choice_is_uniform(demos):
    """The counts of the first number, the first two and each separator slot match a uniform draw
    (plug-in bias ~cells / 2N: 0.001 nats for one number, 0.05 for a pair)."""
    numbers = [listed(d) for d in demos]
    assert _plugin_nats(Counter(ns[0] for ns in numbers)) >= math.log(MEMBERS) - 0.01
    assert _plugin_nats(Counter((ns[0], ns[1]) for ns in numbers)) >= math.log(MEMBERS * (MEMBERS - 1)) - 0.1
    digits_and_seps = [d.split("\n####")[0] for d in demos]
    for slot in range(4):
        seps = Counter(_separators(text)[slot] for text in digits_and_seps)
        assert _plugin_nats(seps) >= math.log(len(SEPARATORS)) - 0.005


def _separators(listing: str) -> list[str]:
    out, current = [], ""
    for ch in listing:
        if ch.isdigit():
            if current:
                out.append(current)
            current = ""
        else:
            current += ch
    return out


def _next_char_nats(texts: list[str]) -> float:
    """Mean plug-in entropy of the next character (the end token included) given the prefix."""
    after: dict[str, Counter] = defaultdict(Counter)
    for text in texts:
        text += "\x00"  # the end token
        for i in range(len(text)):
            after[text[:i]][text[i]] += 1
    total = sum(sum(c.values()) for c in after.values())
    return sum(_plugin_nats(c) * sum(c.values()) for c in after.values()) / total


def test_entropy_per_token_is_about_one_nat(demos):
    """Exact: demonstration_nats over the mean length (+1 end token) is ~0.97 nats a token for this
    problem and >= 0.9 over difficulty-1 problems. Measured by counting: at least 0.35 (a floor; see
    the module docstring), and never above the exact value."""
    tokens = sum(len(d) + 1 for d in demos) / SAMPLES
    exact = demonstration_nats(PROBLEM) / tokens
    assert demonstration_nats(PROBLEM) == pytest.approx(math.log(45 * 44 * 43 * 42 * 41) + 4 * math.log(4))
    assert 0.95 <= exact <= 1.0, exact
    counted = _next_char_nats(demos)
    assert 0.35 <= counted < exact, counted
    rng = random.Random(0)
    problems = TASK.problems("train", 300, seed=0)
    pooled = sum(demonstration_nats(p) for p in problems) / \
        sum(len(TASK.demonstration(p, rng)) + 1 for p in problems)
    assert pooled >= 0.9, pooled
