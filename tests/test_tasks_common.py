"""Properties every generated task must have: valid demonstrations with real variety,
disjoint deterministic splits, short ASCII text, robust scoring, and the registry."""

import random
import time

import pytest

from bebop.errors import BebopError
from bebop.tasks import TASK_NAMES, get_task
from bebop.tasks.base import DIFFICULTIES, Problem, split_of
from bebop.tokenizer import ALPHABET, build_char_tokenizer, codec_from_tokenizer

GENERATED = ("math", "code", "agent")
CODEC = codec_from_tokenizer(build_char_tokenizer())
CONTEXT = 512  # the embedded model's context (tokens)


def n_tokens(text: str) -> int:
    return len(CODEC.encode(text))


def test_registry_names_and_unknown_name():
    assert TASK_NAMES == ("math", "code", "agent", "mix", "pick")
    for name in TASK_NAMES:
        assert get_task(name).name == name
    with pytest.raises(BebopError, match="known tasks: math, code, agent, mix"):
        get_task("chess")


@pytest.mark.parametrize("name", TASK_NAMES)
@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_every_demonstration_scores_one(name, difficulty):
    task = get_task(name, difficulty)
    rng = random.Random(0)
    for split in ("train", "test"):
        for problem in task.problems(split, 40, seed=3):
            for _ in range(5):
                demo = task.demonstration(problem, rng)
                assert task.score(problem, demo) == 1.0, (problem, demo)


@pytest.mark.parametrize("name", TASK_NAMES)
@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_text_is_short_printable_ascii(name, difficulty):
    task = get_task(name, difficulty)
    rng = random.Random(1)
    allowed = set(ALPHABET)
    for problem in task.problems("train", 100, seed=0):
        demo = task.demonstration(problem, rng)
        for tag in ("<call>", "</call>", "<obs>", "</obs>"):
            demo = demo.replace(tag, "")
        assert set(problem.prompt + demo) <= allowed
        assert n_tokens(problem.prompt) <= 160, problem.prompt
        demo = task.demonstration(problem, rng)
        assert n_tokens(demo) <= 400, demo
        assert n_tokens(problem.prompt) + n_tokens(demo) + 1 <= CONTEXT - 16, demo


@pytest.mark.parametrize("name", TASK_NAMES)
def test_train_and_test_are_disjoint(name):
    task = get_task(name, 2)
    train = {p.ground_truth for p in task.problems("train", 400, seed=0)}
    test = {p.ground_truth for p in task.problems("test", 400, seed=0)}
    assert train and test and not train & test


def test_split_is_a_fixed_share():
    tests = sum(split_of(str(i)) == "test" for i in range(10_000))
    assert 1700 < tests < 2300


@pytest.mark.parametrize("name", TASK_NAMES)
def test_problems_are_deterministic_by_seed(name):
    task = get_task(name)
    assert task.problems("train", 20, seed=5) == get_task(name).problems("train", 20, seed=5)
    assert task.problems("train", 20, seed=5) != task.problems("train", 20, seed=6)
    rng_a, rng_b = random.Random(9), random.Random(9)
    p = task.problems("test", 1, seed=0)[0]
    assert task.demonstration(p, rng_a) == task.demonstration(p, rng_b)


@pytest.mark.parametrize("name", GENERATED)
def test_demonstrations_have_variety(name):
    task = get_task(name)
    distinct = []
    for problem in task.problems("train", 20, seed=2):
        rng = random.Random(0)
        distinct.append(len({task.demonstration(problem, rng) for _ in range(50)}))
    distinct.sort()
    assert distinct[len(distinct) // 2] >= 5, distinct  # a typical problem
    assert distinct[0] >= 3, distinct


@pytest.mark.parametrize("name", TASK_NAMES)
def test_garbage_scores_zero_quickly(name):
    task = get_task(name)
    problem = task.problems("train", 1, seed=0)[0]
    start = time.monotonic()
    for junk in ("", "#### ", "\x00\xff", "<call></call>", "#### 99999999999999999999",
                 "a" * 1_000_000, "#### 1\n" * 150_000, "<obs>" * 200_000, "(" * 1_000_000):
        assert task.score(problem, junk) == 0.0
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize("name", TASK_NAMES)
def test_bad_ground_truth_is_a_bebop_error(name):
    task = get_task(name)
    task_name = "math" if name == "mix" else name
    with pytest.raises(BebopError, match="ground truth"):
        task.score(Problem("p", "42", task_name), "#### 42")


def test_bad_split_and_count():
    with pytest.raises(BebopError, match="unknown split"):
        get_task("math").problems("dev", 1, 0)
    with pytest.raises(BebopError, match=">= 0"):
        get_task("code").problems("train", -1, 0)
    with pytest.raises(BebopError, match="difficulty"):
        get_task("agent", 7)


def test_mix_draws_from_all_tasks_and_dispatches():
    mix = get_task("mix")
    problems = mix.problems("train", 60, seed=0)
    assert problems == get_task("mix").problems("train", 60, seed=0)
    assert {p.task for p in problems} == {"math", "code", "agent"}
    rng = random.Random(0)
    for p in problems:
        part = get_task(p.task)
        demo = mix.demonstration(p, rng)
        assert mix.score(p, demo) == part.score(p, demo) == 1.0
        if p.task == "agent":
            call = demo[:demo.index("</call>") + len("</call>")]
            assert mix.observe(p, call) == part.observe(p, call)
        else:
            assert mix.observe(p, "x</call>") is None
