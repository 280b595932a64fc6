"""JSONL reading and writing with errors that name the file, row and key."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from bebop.errors import BebopError
from bebop.fileio import atomic_write_text


def read_jsonl(path: str | os.PathLike, required: Sequence[str] = ()) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise BebopError(f"file not found: {path}")
    rows = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BebopError(f"{path}: row {lineno} is not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise BebopError(f"{path}: row {lineno} is not a JSON object")
            for key in required:
                if key not in row:
                    raise BebopError(f"{path}: row {lineno} has no {key!r} key")
            rows.append(row)
    return rows


def dumps_rows(rows: Iterable[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    atomic_write_text(path, dumps_rows(rows))
