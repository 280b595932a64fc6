"""The math task: prompt format and rewards on hand-written completions."""

import json
import random

from bebop.tasks import get_task
from bebop.tasks.base import Problem, final_answer

TRUTH = json.dumps({"start": 12, "factors": None, "changes": [5, -3, 7], "answer": 21})
PROBLEM = Problem("Ann has 12 eggs. She buys 5, eats 3, then finds 7. How many now?\n",
                  TRUTH, "math")


def test_prompt_format():
    problem = get_task("math").problems("train", 1, seed=0)[0]
    assert problem.task == "math"
    assert problem.prompt.endswith(" How many now?\n")
    assert json.loads(problem.ground_truth)["answer"] >= 0


def test_correct_completions_score_one():
    task = get_task("math")
    for completion in ("12+5=17\n17-3=14\n14+7=21\n#### 21",
                       "12 - 3 = 9\n9 + 5 = 14\n14 + 7 = 21\nSo 21.\n#### 21",
                       "#### 21", "#### 21\n", "Start 12. +5 is 17. -3 is 14. +7 is 21.\n####21"):
        assert task.score(PROBLEM, completion) == 1.0, completion


def test_incorrect_completions_score_zero():
    task = get_task("math")
    for completion in ("12+5=17\n17-3=14\n14+7=21\n#### 22",  # wrong answer
                       "12+5-3+7=21",                          # no final-answer line
                       "#### 21\nmore text",                   # answer not at the end
                       "#### 21.5", "# 21", "#### twenty-one", "21"):
        assert task.score(PROBLEM, completion) == 0.0, completion


def test_final_answer_parsing():
    assert final_answer("x\n#### -4") == -4
    assert final_answer("#### 7 ") == 7
    assert final_answer("#### 1\n#### 2") == 2
    assert final_answer("#### ") is None


def test_product_start_demonstration():
    truth = json.dumps({"start": 36, "factors": [3, 12], "changes": [-6, 2], "answer": 32})
    problem = Problem("Bob has 3 bags of 12 cards. He sells 6, then wins 2. How many now?\n",
                      truth, "math")
    task, rng = get_task("math"), random.Random(0)
    demos = {task.demonstration(problem, rng) for _ in range(30)}
    assert all("3*12" in d.replace(" ", "") or "12*3" in d.replace(" ", "") for d in demos)
    assert all(d.endswith("#### 32") and task.score(problem, d) == 1.0 for d in demos)
