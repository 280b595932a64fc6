"""The code task and its tiny language: interpreter, limits, clear errors, rewards."""

import json
import time

import pytest

from bebop.tasks import get_task
from bebop.tasks.base import Problem
from bebop.tasks.code_lang import CodeError, evaluate_expression, parse_program, run_program
from bebop.tasks.code_task import HIDDEN_INPUTS

OPS = [["mul", 3], ["add", 4]]
PROBLEM = Problem("f(x): take x, times 3, then add 4.\nf(2)=10\n",
                  json.dumps({"ops": OPS, "tests": [[x, 3 * x + 4] for x in HIDDEN_INPUTS]}),
                  "code")


def run(source: str, x: int = 2) -> int:
    return run_program(parse_program(source), x)


def test_language_basics():
    assert run("ret x*3+4") == 10
    assert run("y = x\ny = y * 3; ret y + 4") == 10
    assert run("s=0\ni=1\nwhile i<=x {s=s+i; i=i+1}\nret s", 4) == 10
    assert run("y=0\nrep 3 {\n  y = y + x\n}\nret y", 5) == 15
    assert run("ret -x + 7 / 2 - 7 % 3 + (x == 2) + (x != 2)", 2) == -2 + 3 - 1 + 1 + 0
    assert run("\n\nret 1\n\n") == 1
    assert evaluate_expression("3 * 4 + 2*5") == 22


@pytest.mark.parametrize("source, message", [
    ("", "empty program"),
    ("y = 1", "without 'ret'"),
    ("ret q", "line 1: unknown variable 'q'"),
    ("y=1\nret y/0", "line 2: division by zero"),
    ("ret x +", "line 1: expected a number"),
    ("y = 1 z = 2\nret y", "line 1: expected a new line or ';'"),
    ("rep 3 {y=1\nret 1", "line 2: expected '}', got end of program"),
    ("x=1\n}", "line 2: expected a statement"),
    ("ret x $ 2", "line 1: unexpected character '$'"),
    ("ret " + "(" * 50 + "1" + ")" * 50, "nested too deeply"),
    ("ret 99999999999999", "number too large"),
    ("y=2\nrep 40 {y=y*y}\nret y", "number too large"),
    ("ret 1" + "+1" * 600, "program too long"),
])
def test_errors_are_clear(source, message):
    with pytest.raises(CodeError, match=message.replace("(", r"\(").replace("$", r"\$")):
        run(source)


def test_step_limit_cuts_off_infinite_loops():
    for source in ("while 1 {y=1}\nret 1", "y=0\nwhile y >= 0 {y = y + 1}\nret y",
                   "rep 999999999 {y=1}\nret 1", "rep 1000 {rep 1000 {rep 1000 {y=1}}}\nret 1"):
        start = time.monotonic()
        with pytest.raises(CodeError, match="step limit|time limit"):
            run(source)
        assert time.monotonic() - start < 0.5
        assert get_task("code").score(PROBLEM, source) == 0.0


def test_time_limit():
    with pytest.raises(CodeError, match="time limit"):
        run_program(parse_program("while 1 {y=1}\nret 1"), 0, max_steps=10**9,
                    time_limit_s=0.01)


def test_correct_programs_score_one():
    task = get_task("code")
    for completion in ("ret x*3+4", "ret 4 + 3 * x", "y=x*3\nret y+4", "a=x; a=a*3; a=a+4; ret a",
                       "t=x\nrep 2 {x=x+t}\nrep 4 {x=x+1}\nret x",
                       "ret (x + x + x) + 2 * 2"):
        assert task.score(PROBLEM, completion) == 1.0, completion


def test_wrong_programs_score_zero():
    task = get_task("code")
    for completion in ("ret 10",            # right on the example only
                       "ret (x+4)*3",       # wrong order of steps
                       "ret x*3+4 +",       # syntax error
                       "y=x*3+4",           # no ret
                       "ret x*3+4 # done",  # no comments in the language
                       "def f(x): return 3*x+4"):
        assert task.score(PROBLEM, completion) == 0.0, completion


def test_reward_is_all_or_nothing():
    # right on every hidden input except 0
    assert get_task("code").score(PROBLEM, "y = x*3+4\nwhile x == 0 {y = 0; x = 1}\nret y") == 0.0
