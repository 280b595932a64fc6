"""Your own data: JSONL or parquet rows in verl's or TRL's layout, read into `DataRow`s.

    rows = read_data_rows("train.parquet")      # [DataRow], every row checked, numbered from 1

Layouts (keys; anything else in a row is ignored):

    verl RL    {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "..."}],
                "reward_model": {"style": "rule", "ground_truth": "72"}, "extra_info": {...}}
    TRL        {"prompt": "..." or [messages], "solution": "..."}   ("answer" or "ground_truth" too)
    SFT        {"prompt": ..., "completion": "..." or [assistant messages]}   ("response": verl's SFT)
               {"messages": [..., {"role": "assistant", "content": "..."}]}   (TRL conversational)

A prompt is text (used as given) or a list of chat messages (rendered later with the model's chat
template, bebop.policy.Policy.prompt_text). Errors name the file and the row (1-based: a JSONL
row's number is its line).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bebop.chat import check_messages
from bebop.errors import BebopError
from bebop.jsonl import read_numbered

Rows = list[tuple[int, dict]]  # (1-based row number, row)
Prompt = str | list[dict]  # text, or chat messages
GROUND_TRUTH_KEYS = ("ground_truth", "solution", "answer")  # top-level; verl nests it in reward_model
COMPLETION_KEYS = ("completion", "response")
FORMATS = (".jsonl", ".parquet")


@dataclass(frozen=True, eq=False)
class DataRow:
    number: int  # 1-based row number in its file
    prompt: Prompt
    ground_truth: Any = None  # what the reward checks against, as the file gives it; None = absent
    data_source: str = ""  # which scorer applies (verl's default_compute_score keys on it)
    extra_info: dict | None = None  # passed to a custom reward as is
    completion: Prompt | None = None  # SFT: the demonstration (text, or assistant messages)


def require(row: dict, key: str, number: int, path: str | os.PathLike) -> Any:
    """row[key], or a BebopError naming the file, the row number and the key."""
    if key not in row:
        raise BebopError(f"{path}: row {number} has no {key!r} key")
    return row[key]


def read_parquet(path: str | os.PathLike) -> Rows:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise BebopError("reading parquet needs pyarrow: pip install pyarrow") from None
    try:
        rows = pq.read_table(path).to_pylist()
    except (OSError, ValueError) as exc:  # pyarrow's errors subclass these
        raise BebopError(f"cannot read {path}: {str(exc).splitlines()[0]}") from None
    return list(enumerate(rows, start=1))


def read_rows(path: str | os.PathLike) -> Rows:
    """The numbered rows of a .jsonl or .parquet file; missing, empty or another format: a BebopError."""
    path = Path(path)
    if path.suffix not in FORMATS:
        raise BebopError(f"{path}: unknown dataset format {path.suffix or '(no suffix)'!r}; "
                         f"use {' or '.join(FORMATS)}")
    if not path.is_file():
        raise BebopError(f"dataset file not found: {path}")
    rows = read_parquet(path) if path.suffix == ".parquet" else read_numbered(path)
    if not rows:
        raise BebopError(f"{path}: the dataset has no rows")
    return rows


def _messages_or_text(value: Any, what: str) -> Prompt:
    if isinstance(value, str):
        if not value:
            raise BebopError(f"{what} is empty")
        return value
    return check_messages(value, what)


def _split_conversation(row: dict, where: str) -> tuple[Prompt, Prompt | None]:
    """TRL's conversational rows: the messages up to the final assistant turn, and that turn."""
    messages = check_messages(row["messages"], f"{where} 'messages'")
    if messages[-1]["role"] == "assistant":
        if len(messages) == 1:
            raise BebopError(f"{where} 'messages' holds only an assistant turn: there is no prompt")
        return messages[:-1], messages[-1:]
    return messages, None


def _ground_truth(row: dict) -> Any:
    nested = row.get("reward_model")
    if isinstance(nested, dict) and nested.get("ground_truth") is not None:
        return nested["ground_truth"]
    return next((row[key] for key in GROUND_TRUTH_KEYS if row.get(key) is not None), None)


def _completion(row: dict, where: str) -> Prompt | None:
    for key in COMPLETION_KEYS:
        if row.get(key) is not None:
            return _messages_or_text(row[key], f"{where} {key!r}")
    return None


def parse_row(number: int, row: dict, path: str | os.PathLike) -> DataRow:
    where = f"{path}: row {number}"
    if row.get("prompt") is not None:
        prompt, completion = _messages_or_text(row["prompt"], f"{where} 'prompt'"), _completion(row, where)
    elif row.get("messages") is not None:
        prompt, completion = _split_conversation(row, where)
    else:
        raise BebopError(f"{where} has no 'prompt' (nor 'messages') key")
    extra = row.get("extra_info")
    if extra is not None and not isinstance(extra, dict):
        raise BebopError(f"{where} 'extra_info' must be an object, got {type(extra).__name__}")
    source = row.get("data_source")
    return DataRow(number, prompt, _ground_truth(row), "" if source is None else str(source), extra, completion)


def read_data_rows(path: str | os.PathLike) -> list[DataRow]:
    """Every row of a dataset file, parsed and checked (the first bad row is the error)."""
    return [parse_row(number, row, path) for number, row in read_rows(path)]
