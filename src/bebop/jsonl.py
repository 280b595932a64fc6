"""JSONL reading and writing with errors that name the file, row and key."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from bebop.errors import BebopError
from bebop.fileio import atomic_write_text


def read_numbered(path: str | os.PathLike) -> list[tuple[int, dict]]:
    """(line number, row) for every non-blank line of a JSONL file; each row must be a JSON object."""
    path = Path(path)
    if not path.is_file():
        raise BebopError(f"file not found: {path}")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise BebopError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    rows = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BebopError(f"{path}: row {lineno} is not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise BebopError(f"{path}: row {lineno} is not a JSON object")
        rows.append((lineno, row))
    return rows


def read_jsonl(path: str | os.PathLike, required: Sequence[str] = ()) -> list[dict]:
    """The rows of a JSONL file, each checked to hold the `required` keys."""
    rows = []
    for lineno, row in read_numbered(path):
        for key in required:
            if key not in row:
                raise BebopError(f"{path}: row {lineno} has no {key!r} key")
        rows.append(row)
    return rows


def dumps_rows(rows: Iterable[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    atomic_write_text(path, dumps_rows(rows))
