"""Long-tail response lengths: most demonstrations are short, a few are long, all fit the context."""

import json
import random
from collections import Counter

import pytest

from bebop.errors import BebopError
from bebop.tasks import get_task
from bebop.tasks.base import DIFFICULTIES, long_tail_count
from bebop.tasks.math_task import MAX_CHANGES
from bebop.tokenizer import build_char_tokenizer, codec_from_tokenizer

CODEC = codec_from_tokenizer(build_char_tokenizer())
CONTEXT = 512  # the embedded model's context (tokens)


def percentile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def n_changes(problem) -> int:
    return len(json.loads(problem.ground_truth)["changes"])


def test_long_tail_count_is_skewed_and_bounded():
    rng = random.Random(0)
    counts = Counter(long_tail_count(rng, 1, 12, 0.75) for _ in range(20_000))
    assert set(counts) == set(range(1, 13))
    assert all(counts[n] > counts[n + 2] for n in range(1, 11))  # decreasing
    assert 0.2 < counts[1] / 20_000 < 0.3 and counts[12] > 50
    assert {long_tail_count(rng, 3, 3, 0.5) for _ in range(10)} == {3}
    with pytest.raises(BebopError, match="lo <= hi"):
        long_tail_count(rng, 5, 2, 0.5)


def test_math_demonstrations_have_a_long_tail():
    task, rng = get_task("math"), random.Random(0)
    problems = task.problems("train", 500, seed=0)
    lengths = [len(task.demonstration(p, rng)) for p in problems]
    assert percentile(lengths, 0.9) >= 1.8 * percentile(lengths, 0.5), sorted(lengths)
    assert max(lengths) >= 250
    assert max(lengths) <= 400
    assert max(n_changes(p) for p in problems) == MAX_CHANGES


def test_longest_math_problems_are_right_and_fit_the_context():
    task, rng = get_task("math"), random.Random(1)
    longest = [p for p in task.problems("train", 2000, seed=1) if n_changes(p) == MAX_CHANGES]
    assert len(longest) >= 5
    for problem in longest:
        assert len(problem.prompt) <= 160, problem.prompt
        for _ in range(10):
            demo = task.demonstration(problem, rng)
            assert task.score(problem, demo) == 1.0, demo
            assert len(demo) >= 12 * 10 and demo.count("\n") >= MAX_CHANGES  # one line a change
            assert len(CODEC.encode(problem.prompt + demo)) + 1 <= CONTEXT - 16, demo


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_long_math_problems_are_disjoint_across_splits(difficulty):
    task = get_task("math", difficulty)
    train = {p.ground_truth for p in task.problems("train", 1000, seed=0) if n_changes(p) >= 6}
    test = {p.ground_truth for p in task.problems("test", 1000, seed=0) if n_changes(p) >= 6}
    assert len(train) > 50 and len(test) > 50 and not train & test


def test_higher_difficulty_is_longer():
    medians = []
    for difficulty in DIFFICULTIES:
        task, rng = get_task("math", difficulty), random.Random(0)
        medians.append(percentile([len(task.demonstration(p, rng))
                                   for p in task.problems("train", 300, seed=0)], 0.5))
    assert medians == sorted(medians) and medians[0] < medians[-1], medians


@pytest.mark.parametrize("name, longest", [("code", 8), ("agent", 6)])
def test_code_and_agent_have_long_tails_too(name, longest):
    task, rng = get_task(name), random.Random(0)
    problems = task.problems("train", 1000, seed=0)
    truths = [json.loads(p.ground_truth) for p in problems]
    sizes = [len(t["ops"]) if name == "code" else len(t["question"]["items"]) for t in truths]
    assert max(sizes) == longest and Counter(sizes).most_common(1)[0][0] == 1
    lengths = [len(task.demonstration(p, rng)) for p in problems]
    assert percentile(lengths, 0.9) >= 1.5 * percentile(lengths, 0.5) and max(lengths) < 350
