"""Rewards for dataset rows, called as verl calls a custom reward function, by keyword:

    fn(data_source=..., solution_str=..., ground_truth=..., extra_info=...) -> float
    (any parameter order, keyword-only or **kwargs alike; an `async def` reward is awaited)

    --reward math                      the built-in math-verify scorer (bebop.tasks.math_answers)
    --reward my_pkg.rewards:score      a function of an importable module
    --reward path/to/reward.py:score   a function defined in a Python file
    (no --reward)                      chosen per row from its data_source, as verl's default scorer
                                       does: gsm8k-, MATH-, DAPO-, AIME- and Numina-style sources
                                       score with math-verify; any other source is an error

The signature is checked when the reward is loaded, before any rollout: one that cannot take those four
keywords is a BebopError naming it. A function may return a number, a bool, or a dict with a "score"
(verl's richer form). A call that
raises, or returns something else or a non-finite number, scores 0 and is reported with its row
(`RowScore.error`); it never stops the run.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import importlib.util
import inspect
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bebop.errors import BebopError
from bebop.tasks.data_files import DataRow
from bebop.tasks.math_answers import checkable_truth, math_verify_reward

RewardFn = Callable[..., Any]  # called by keyword: VERL_KEYWORDS
VERL_KEYWORDS = ("data_source", "solution_str", "ground_truth", "extra_info")
BUILTIN_REWARDS: dict[str, RewardFn] = {"math": math_verify_reward}
# the data sources verl's default_compute_score scores as math (its gsm8k, MATH, DAPO and PRIME scorers)
MATH_SOURCES = frozenset({
    "openai/gsm8k", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "math_dapo",
    "numina_aops_forum", "numina_synthetic_math", "numina_amc_aime", "numina_synthetic_amc", "numina_cn_k12",
    "numina_olympiads"})
MATH_SOURCE_PREFIXES = ("aime",)


def _function_of(module: Any, name: str, spec: str) -> RewardFn:
    fn = getattr(module, name, None)
    if not callable(fn):
        raise BebopError(f"--reward {spec}: {module.__name__} has no function {name!r}")
    check_signature(fn, spec)
    return fn


def check_signature(fn: RewardFn, spec: str) -> None:
    """A BebopError naming the reward unless it can be called with verl's four keywords."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin without a signature: the call itself will say
    try:
        signature.bind(**dict.fromkeys(VERL_KEYWORDS))
    except TypeError as exc:
        raise BebopError(f"--reward {spec}: {getattr(fn, '__name__', fn)}{signature} cannot be called as verl calls "
                         f"a reward, by keyword ({', '.join(VERL_KEYWORDS)}): {exc}") from None


def call_reward(fn: RewardFn, data_source: str, solution_str: str, ground_truth: Any, extra_info: Any) -> Any:
    """fn's value for one completion, called as verl calls it: by keyword, a coroutine awaited."""
    value = fn(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth, extra_info=extra_info)
    if inspect.isawaitable(value):
        value = asyncio.run(_awaited(value))
    return value


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _load_file(path: Path, spec: str) -> Any:
    if not path.is_file():
        raise BebopError(f"--reward {spec}: file not found: {path}")
    module_name = "bebop_reward_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise BebopError(f"--reward {spec}: {path} is not a Python file")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module  # so that functions and classes defined in it can be pickled
    loader_spec.loader.exec_module(module)
    return module


def load_reward(spec: str) -> RewardFn:
    """The function a --reward spec names; a spec that cannot be imported is a BebopError naming it."""
    if spec in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[spec]
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise BebopError(f"--reward {spec!r}: use {' or '.join(BUILTIN_REWARDS)}, module:function or "
                         f"path/to/file.py:function")
    try:
        module = _load_file(Path(where), spec) if where.endswith(".py") else importlib.import_module(where)
    except BebopError:
        raise
    except Exception as exc:  # the user's module failed to import: say which and why, in one line
        raise BebopError(f"--reward {spec}: cannot import {where}: {type(exc).__name__}: {exc}") from None
    return _function_of(module, name, spec)


def absolute_spec(spec: str) -> str:
    """A file spec with its path made absolute (Ray workers need not share the driver's directory)."""
    where, sep, name = spec.rpartition(":")
    return f"{Path(where).resolve()}:{name}" if sep and where.endswith(".py") else spec


def default_reward(data_source: str) -> RewardFn | None:
    """The scorer verl's default_compute_score would pick for a data source (None: no known one)."""
    if data_source in MATH_SOURCES or data_source.startswith(MATH_SOURCE_PREFIXES):
        return math_verify_reward
    return None


def _needs_ground_truth(row: DataRow, fn: RewardFn, path: Any) -> None:
    if fn is math_verify_reward and not checkable_truth(row.ground_truth):
        raise BebopError(f"{path}: row {row.number} has no ground truth the math reward can check (a text or "
                         f"number in 'reward_model.ground_truth', 'ground_truth', 'solution' or 'answer')")


def row_rewards(rows: Sequence[DataRow], spec: str, path: Any) -> list[RewardFn]:
    """Each row's reward: `spec`'s function, or by data_source without one. Checked before any rollout:
    a row whose source has no scorer, or that lacks what its reward needs, is a BebopError naming it."""
    chosen = load_reward(spec) if spec else None
    out = []
    for row in rows:
        fn = chosen or default_reward(row.data_source)
        if fn is None:
            source = repr(row.data_source) if row.data_source else "no data_source"
            raise BebopError(f"{path}: row {row.number} has {source}, which no built-in scorer knows; pass "
                             f"--reward math, --reward module:function or --reward path/to/file.py:function")
        _needs_ground_truth(row, fn, path)
        out.append(fn)
    return out


@dataclass(frozen=True)
class RowScore:
    reward: float
    error: str | None = None  # why the reward was set to 0 (the call raised, or returned no number)


def _as_number(value: Any) -> float:
    if isinstance(value, dict) and "score" in value:
        value = value["score"]
    if isinstance(value, bool):
        return float(value)
    if hasattr(value, "item") and callable(value.item):  # a numpy or torch scalar
        value = value.item()
    if not isinstance(value, (int, float)):
        raise TypeError(f"the reward returned {type(value).__name__}, not a number")
    if not math.isfinite(value):
        raise ValueError(f"the reward returned {value}")
    return float(value)


def score_row(fn: RewardFn, row: DataRow, completion: str) -> RowScore:
    """fn's reward for one completion of `row`; anything that goes wrong scores 0, with the reason."""
    try:
        return RowScore(_as_number(call_reward(fn, row.data_source, completion, row.ground_truth, row.extra_info)))
    except Exception as exc:  # a user's reward must not stop the run: report it with the row instead
        return RowScore(0.0, f"{type(exc).__name__}: {exc}")
