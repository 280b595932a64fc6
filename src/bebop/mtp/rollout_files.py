"""Rollouts other engines and RL frameworks wrote, read as (prompt_ids, response_ids) pairs.

    pairs = read_rollouts("dump.jsonl", policy)      # [RolloutIds(row=3, prompt_ids=[...], response_ids=[...]), ...]

One JSON object per line (or one JSON list of objects); each row in one of these shapes, token ids used as
given (never re-tokenised):
    verl / bebop rl       {"prompt_ids": [...], "response_ids": [...]}   ("completion_ids": bebop's MTP data cache)
    vLLM RequestOutput    {"prompt_token_ids": [...], "outputs": [{"token_ids": [...]}, ...]}   (one pair per output)
    SGLang                {"input_ids" or "prompt_ids": [...], "output_ids": [...]}
    bebop generate        {"prompt_token_ids" / "prompt_ids" / "input_ids": [...] or "prompt": "...", "token_ids": [...]}
    plain ids             {"token_ids": [...]}   (the whole sequence: its first token is the prompt)
    text                  {"prompt": "..." or [messages], "completion"/"response": "..." or [assistant messages]}
                          or {"messages": [..., assistant turn]}: encoded with the model's tokenizer and template
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bebop.errors import BebopError
from bebop.jsonl import read_numbered
from bebop.policy import Policy, encode_prompt
from bebop.tasks.data_files import parse_row

PROMPT_ID_KEYS = ("prompt_ids", "prompt_token_ids", "input_ids")
RESPONSE_ID_KEYS = ("response_ids", "completion_ids", "output_ids", "token_ids")


@dataclass(frozen=True)
class RolloutIds:
    row: int  # the file's line (or list index + 1)
    prompt_ids: list[int]
    response_ids: list[int]


def read_rollouts(path: str | os.PathLike, policy: Policy) -> list[RolloutIds]:
    """Every (prompt, response) of a rollout file, checked against the model's vocabulary."""
    rows = _rows(Path(path))
    if not rows:
        raise BebopError(f"{path}: no rollouts (the file is empty)")
    out: list[RolloutIds] = []
    vocab = policy.model.config.vocab_size
    for number, row in rows:
        where = f"{path}: row {number}"
        for prompt, response in _pairs(row, number, path, policy):
            bad = next((t for t in prompt + response if not isinstance(t, int) or isinstance(t, bool)
                        or not 0 <= t < vocab), None)
            if bad is not None:
                raise BebopError(f"{where}: token id {bad!r} is not in the model's vocabulary (0..{vocab - 1})")
            if not prompt:
                raise BebopError(f"{where}: the prompt is empty")
            out.append(RolloutIds(number, prompt, response))
    return out


def _rows(path: Path) -> list[tuple[int, dict]]:
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BebopError(f"cannot read {path}: {exc}") from None
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise BebopError(f"{path}: a .json rollout file must hold a list of objects")
        return list(enumerate(data, start=1))
    return read_numbered(path)


def _ids(row: dict, keys: Sequence[str], where: str) -> list[int] | None:
    for key in keys:
        if row.get(key) is not None:
            value = row[key]
            if not isinstance(value, list):
                raise BebopError(f"{where}: {key!r} must be a list of token ids")
            return value
    return None


def _pairs(row: dict, number: int, path: str | os.PathLike, policy: Policy) -> list[tuple[list[int], list[int]]]:
    where = f"{path}: row {number}"
    prompt = _ids(row, PROMPT_ID_KEYS, where)
    if isinstance(row.get("outputs"), list):  # vLLM's RequestOutput
        if prompt is None:
            raise BebopError(f"{where}: 'outputs' without 'prompt_token_ids'")
        return [(prompt, _ids(o, ("token_ids",), where) or []) for o in row["outputs"] if isinstance(o, dict)]
    response = _ids(row, RESPONSE_ID_KEYS, where)
    if response is not None:
        if prompt is None and isinstance(row.get("prompt"), str):
            prompt = policy.codec.encode(row["prompt"])
        if prompt is None:  # the whole sequence in token_ids
            return [(response[:1], response[1:])]
        return [(prompt, response)]
    if prompt is not None:
        raise BebopError(f"{where}: has prompt ids but no response ids (one of {', '.join(RESPONSE_ID_KEYS)})")
    return [_text_pair(row, number, path, policy)]


def _text_pair(row: dict, number: int, path: str | os.PathLike, policy: Policy) -> tuple[list[int], list[int]]:
    where = f"{path}: row {number}"
    data = parse_row(number, row, path)
    if data.completion is None:
        raise BebopError(f"{where}: no token ids and no completion (looked for {', '.join(RESPONSE_ID_KEYS)}, "
                         "'completion', 'response', or 'messages' ending with the assistant's turn)")
    completion = data.completion if isinstance(data.completion, str) else \
        "".join(str(m.get("content", "")) for m in data.completion)
    response = policy.codec.encode(completion)
    if policy.codec.token_id("<unk>") in response:
        raise BebopError(f"{where}: the completion does not match the model's tokenizer (it encodes to <unk>)")
    return encode_prompt(policy, policy.prompt_text(data.prompt, what=where), where), response
