"""The agent task: the shop environment's observations and replayed scoring."""

import json
import random

from bebop.tasks import get_task
from bebop.tasks.agent_task import MAX_CALLS
from bebop.tasks.base import Problem

DB = {"pen": [4, 12], "cup": [5, 3], "hat": [9, 7], "jar": [2, 8]}
TRUTH = {"db": DB, "question": {"kind": "cost", "items": ["pen", "cup"], "qtys": [3, 2]},
         "answer": 22}
PROBLEM = Problem("How much for 3 pen and 2 cup?\n", json.dumps(TRUTH), "agent")
TASK = get_task("agent")
GOOD = "<call>price pen</call><obs>4</obs><call>price cup</call><obs>5</obs>3*4+2*5=22\n#### 22"


def test_observe_answers_the_last_call():
    assert TASK.observe(PROBLEM, "<call>price pen</call>") == "<obs>4</obs>"
    assert TASK.observe(PROBLEM, GOOD[:GOOD.index("<obs>")] + "x<call>stock cup</call>") \
        == "<obs>3</obs>"
    assert TASK.observe(PROBLEM, "<call>calc 3*4 + 2*5</call>") == "<obs>22</obs>"
    assert TASK.observe(PROBLEM, "<call>price  hat </call>") == "<obs>9</obs>"


def test_observe_errors_are_observations():
    assert TASK.observe(PROBLEM, "<call>price dog</call>") == "<obs>error: no item dog</obs>"
    assert TASK.observe(PROBLEM, "<call>buy pen</call>").startswith("<obs>error: tools are")
    assert TASK.observe(PROBLEM, "<call>calc 1/0</call>") \
        == "<obs>error: line 1: division by zero</obs>"
    assert TASK.observe(PROBLEM, "no call here</call>") == "<obs>error: no call</obs>"
    assert TASK.observe(PROBLEM, "<call>" + "9" * 500 + "</call>") == "<obs>error: bad call</obs>"
    many = "<call>price pen</call><obs>4</obs>" * MAX_CALLS + "<call>price pen</call>"
    assert TASK.observe(PROBLEM, many) == "<obs>error: too many calls</obs>"


def test_correct_transcripts_score_one():
    for completion in (GOOD,
                       "Look up.\n<call>price cup</call><obs>5</obs>\n<call>price pen</call>"
                       "<obs>4</obs><call>calc 2*5+3*4</call><obs>22</obs>\nSo 22.\n#### 22",
                       "<call>price pen</call><obs>4</obs><call>calc 1/0</call>"
                       "<obs>error: line 1: division by zero</obs><call>price cup</call>"
                       "<obs>5</obs>12+10=22\n#### 22",
                       "#### 22"):  # a lucky guess without tools still counts
        assert TASK.score(PROBLEM, completion) == 1.0, completion


def test_wrong_transcripts_score_zero():
    for completion in (GOOD.replace("#### 22", "#### 23"),                  # wrong answer
                       GOOD.replace("<obs>5</obs>", "<obs>6</obs>"),         # forged value
                       GOOD.replace("<obs>5</obs>", ""),                      # observation dropped
                       "<obs>4</obs>#### 22",                                 # observation without call
                       GOOD + "<obs>1</obs>",                                 # trailing observation
                       GOOD[:GOOD.index("#### 22")] + "<call>price pen</call>",  # never answers
                       "<call>price pen</call><obs>4</obs>#### 22<call>",     # unfinished call
                       "<call>price pen<obs>4</obs></call><obs>4</obs>#### 22",  # obs inside call
                       "<call>price pen</call><obs>4</obs>" * (MAX_CALLS + 1) + "#### 22"):
        assert TASK.score(PROBLEM, completion) == 0.0, completion


def test_demonstration_observations_match_the_environment():
    rng = random.Random(0)
    for problem in TASK.problems("test", 30, seed=1):
        demo = TASK.demonstration(problem, rng)
        pos = 0
        while (end := demo.find("</call>", pos)) >= 0:
            end += len("</call>")
            reply = TASK.observe(problem, demo[:end])
            assert demo.startswith(reply, end) and "error" not in reply
            pos = end + len(reply)
