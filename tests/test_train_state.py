"""Resuming refuses another configuration and names what differs (one comparison for every command:
sft, mtp train, rl and the demo use train_state.config_diff)."""

import pytest

from bebop.errors import BebopError
from bebop.train_state import check_same_config, config_diff


def test_config_diff_names_every_changed_added_or_missing_key():
    saved = {"lr": 0.1, "steps": 5, "task": "math", "gone": 1}
    assert config_diff(saved, dict(saved)) == []
    assert config_diff(saved, {"lr": 0.2, "steps": 5, "task": "math", "new": 0}) == ["gone", "lr", "new"]
    assert config_diff({"k": 3}, {"k": "3"}) == ["k"]  # types matter: 3 is not "3"


def test_check_same_config_raises_naming_the_run_and_the_fields(tmp_path):
    check_same_config({"a": 1}, {"a": 1}, tmp_path)
    with pytest.raises(BebopError, match=rf"cannot resume {tmp_path}: config differs in a, b$"):
        check_same_config({"a": 1, "b": 2}, {"a": 2, "b": 3}, tmp_path)
