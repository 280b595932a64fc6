"""Rewards (issue 16, part 3): --reward math | module:function | file.py:function with verl's signature,
the default scorer by data_source, and a reward that fails scoring 0 with its reason instead of crashing."""

import math
import pickle
import sys

import pytest

from bebop.errors import BebopError
from bebop.tasks.data_files import DataRow
from bebop.tasks.math_answers import math_verify_reward
from bebop.tasks.rewards import absolute_spec, default_reward, load_reward, row_rewards, score_row

REWARD_FILE = """
calls = []

def length_reward(data_source, solution_str, ground_truth, extra_info):
    calls.append((data_source, solution_str, ground_truth, extra_info))
    return len(solution_str) / 10

def broken(data_source, solution_str, ground_truth, extra_info):
    raise KeyError("boom")
"""


@pytest.fixture()
def reward_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(REWARD_FILE)
    return path


def test_file_and_module_specs_load_the_named_function(reward_file, monkeypatch):
    fn = load_reward(f"{reward_file}:length_reward")
    row = DataRow(4, "p", ground_truth="gt", data_source="mine", extra_info={"k": 1})
    assert score_row(fn, row, "abcde").reward == 0.5
    assert sys.modules[fn.__module__].calls == [("mine", "abcde", "gt", {"k": 1})]
    assert pickle.loads(pickle.dumps(fn))(None, "ab", None, None) == 0.2  # travels to Ray workers
    monkeypatch.syspath_prepend(str(reward_file.parent))
    assert load_reward("my_reward:length_reward")("s", "abc", None, None) == pytest.approx(0.3)
    assert load_reward("math") is math_verify_reward
    monkeypatch.chdir(reward_file.parent)
    assert absolute_spec("my_reward.py:length_reward") == f"{reward_file}:length_reward"  # for Ray workers
    assert absolute_spec("pkg.mod:fn") == "pkg.mod:fn" and absolute_spec("math") == "math"


@pytest.mark.parametrize("spec, message", [
    ("nocolon", "use math, module:function or path/to/file.py:function"),
    ("missing.py:fn", "file not found: missing.py"),
    ("no_such_module_xyz:fn", "cannot import no_such_module_xyz: ModuleNotFoundError"),
    ("{file}:nope", "has no function 'nope'"),
    ("{bad}:fn", "cannot import .*bad.py: ZeroDivisionError: division by zero"),
])
def test_specs_that_cannot_be_imported_name_the_problem(tmp_path, reward_file, spec, message):
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1 / 0\n")
    with pytest.raises(BebopError, match=f"--reward .*{message}"):
        load_reward(spec.format(file=reward_file, bad=bad))


def test_default_scorer_by_data_source_as_verl():
    for source in ("openai/gsm8k", "lighteval/MATH", "HuggingFaceH4/MATH-500", "math_dapo", "aime2024",
                   "numina_olympiads"):
        assert default_reward(source) is math_verify_reward
    assert default_reward("codecontests") is None and default_reward("") is None


def test_rows_are_checked_before_any_rollout(reward_file):
    rows = [DataRow(1, "p", "1", "openai/gsm8k"), DataRow(3, "q", "2", "my_source")]
    with pytest.raises(BebopError, match="d.jsonl: row 3 has 'my_source', which no built-in scorer knows; pass "
                                         "--reward math"):
        row_rewards(rows, "", "d.jsonl")
    assert row_rewards(rows, "math", "d.jsonl") == [math_verify_reward] * 2
    with pytest.raises(BebopError, match="d.jsonl: row 2 has no ground truth the math reward can check"):
        row_rewards([DataRow(2, "p", None, "openai/gsm8k")], "", "d.jsonl")
    with pytest.raises(BebopError, match="row 5 has no data_source"):
        row_rewards([DataRow(5, "p", "1")], "", "d.jsonl")
    custom = row_rewards([DataRow(2, "p", None, "anything")], f"{reward_file}:length_reward", "d.jsonl")
    assert custom[0].__name__ == "length_reward"  # a custom reward decides what it needs


@pytest.mark.parametrize("returned, reward, error", [
    (1, 1.0, None), (True, 1.0, None), ({"score": 0.25, "acc": True}, 0.25, None),
    (float("nan"), 0.0, "ValueError: the reward returned nan"),
    (math.inf, 0.0, "ValueError: the reward returned inf"),
    ("1.0", 0.0, "TypeError: the reward returned str, not a number"),
    (None, 0.0, "TypeError: the reward returned NoneType, not a number"),
])
def test_what_a_reward_returns(returned, reward, error):
    result = score_row(lambda **verl_keywords: returned, DataRow(1, "p"), "c")
    assert (result.reward, result.error) == (reward, error)


def test_a_reward_that_raises_scores_zero_with_its_reason(reward_file):
    result = score_row(load_reward(f"{reward_file}:broken"), DataRow(1, "p"), "c")
    assert (result.reward, result.error) == (0.0, "KeyError: 'boom'")


VERL_STYLE_REWARDS = """
import asyncio

def reordered(solution_str, ground_truth, data_source, extra_info=None):
    return float(solution_str.strip() == ground_truth) + (0.5 if data_source == "mine" else 0.0)

def keyword_only(*, data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return {"score": float(solution_str.strip() == ground_truth), "source": data_source}

async def awaited(data_source, solution_str, ground_truth, extra_info):
    await asyncio.sleep(0)
    return float(solution_str.strip() == ground_truth) + extra_info["bonus"]

def too_few(solution, answer):
    return 1.0

def positional_only(data_source, solution_str, ground_truth, extra_info, /):
    return 1.0
"""


def verl_score(fn, row, completion):
    """What verl's reward manager computes: the function called by keyword, a coroutine awaited, a dict's score."""
    import asyncio
    import inspect

    value = fn(data_source=row.data_source, solution_str=completion, ground_truth=row.ground_truth,
               extra_info=row.extra_info)
    value = asyncio.run(value) if inspect.iscoroutine(value) else value
    return float(value["score"] if isinstance(value, dict) else value)


@pytest.mark.parametrize("name", ["reordered", "keyword_only", "awaited"])
def test_verl_rewards_score_what_verl_scores_whatever_their_parameter_order(tmp_path, name):
    path = tmp_path / "verl_rewards.py"
    path.write_text(VERL_STYLE_REWARDS)
    fn = load_reward(f"{path}:{name}")
    row = DataRow(1, "p", ground_truth="42", data_source="mine", extra_info={"bonus": 0.25})
    for completion in ("42", " 42\n", "41"):
        result = score_row(fn, row, completion)
        assert result.error is None and result.reward == verl_score(fn, row, completion)
    assert score_row(fn, row, "42").reward > score_row(fn, row, "41").reward


@pytest.mark.parametrize("name", ["too_few", "positional_only"])
def test_a_reward_that_cannot_take_verls_keywords_is_refused_when_loaded(tmp_path, name):
    path = tmp_path / "verl_rewards.py"
    path.write_text(VERL_STYLE_REWARDS)
    with pytest.raises(BebopError, match=f"--reward .*{name}.* cannot be called as verl calls a reward, by keyword"):
        load_reward(f"{path}:{name}")
