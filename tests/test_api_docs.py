"""docs/api.md's examples run as written: its `python` blocks, in order, in one namespace."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "api.md").read_text(), flags=re.S)


def test_the_api_page_has_its_examples():
    assert len(_blocks()) >= 5


def test_the_api_examples_run(tmp_path, monkeypatch, digit_reward):
    pytest.importorskip("math_verify")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for i, block in enumerate(_blocks()):
        exec(compile(block, f"docs/api.md block {i + 1}", "exec"), namespace)  # noqa: S102 (our own docs)
    assert (tmp_path / "run" / "metrics.jsonl").is_file()
