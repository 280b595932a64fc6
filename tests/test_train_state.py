"""Resuming refuses another configuration and names what differs (one comparison for every command:
sft, mtp train, rl and the demo use train_state.config_diff)."""

import pathlib
import random

import numpy as np
import pytest
import torch

from bebop.errors import BebopError
from bebop.train_state import (
    STATE_FILE,
    check_same_config,
    config_diff,
    load_train_state,
    rng_state,
    save_train_state,
    set_rng_state,
)


def test_config_diff_names_every_changed_added_or_missing_key():
    saved = {"lr": 0.1, "steps": 5, "task": "math", "gone": 1}
    assert config_diff(saved, dict(saved)) == []
    assert config_diff(saved, {"lr": 0.2, "steps": 5, "task": "math", "new": 0}) == ["gone", "lr", "new"]
    assert config_diff({"k": 3}, {"k": "3"}) == ["k"]  # types matter: 3 is not "3"


def test_check_same_config_raises_naming_the_run_and_the_fields(tmp_path):
    check_same_config({"a": 1}, {"a": 1}, tmp_path)
    with pytest.raises(BebopError, match=rf"cannot resume {tmp_path}: config differs in a, b$"):
        check_same_config({"a": 1, "b": 2}, {"a": 2, "b": 3}, tmp_path)


class RunsCode:
    """What a hostile state.pt could hold: unpickling it calls Path.touch (or anything else)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def test_a_state_whose_pickle_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "ran"
    torch.save({"step": 1, "payload": RunsCode(marker)}, tmp_path / STATE_FILE)
    with pytest.raises(BebopError, match=r"refusing to load .*not plain data \(builtins.getattr, pathlib"):
        load_train_state(tmp_path)
    assert not marker.exists()


def test_rl_resume_refuses_a_hostile_state_in_one_line(tmp_path, capsys):
    from bebop.cli import main
    from bebop.rl.checkpoint import STATE_FILE as RL_STATE
    from bebop.rl.checkpoint import load_checkpoint

    from rl_helpers import make_headed

    model = make_headed(tmp_path / "headed", tmp_path / "base")
    args = ["rl", "--model", str(model), "--task", "math", "--steps", "1", "--group-size", "2", "--batch-prompts",
            "1", "--max-new-tokens", "8", "--out", str(tmp_path / "run")]
    assert main(args) == 0
    state_path = load_checkpoint(tmp_path / "run").path / RL_STATE
    state = torch.load(state_path, weights_only=True)
    marker = tmp_path / "ran"
    torch.save({**state, "payload": RunsCode(marker)}, state_path)
    capsys.readouterr()
    assert main(args + ["--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: refusing to load") and len(err.splitlines()) == 1 and not marker.exists()


def test_states_are_plain_data_and_random_states_round_trip(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    save_train_state(tmp_path, {"rng": rng_state(), "data_rng": random.Random(4).getstate(), "step": 7})
    assert torch.serialization.get_unsafe_globals_in_checkpoint(tmp_path / STATE_FILE) == []
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(load_train_state(tmp_path)["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_a_state_written_before_the_rule_still_resumes(tmp_path):
    """Older bebop saved numpy's random state as numpy's own tuple (an array inside)."""
    np.random.seed(5)
    legacy = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    torch.save({"rng": legacy, "step": 2}, tmp_path / STATE_FILE)
    expected = np.random.rand()
    state = load_train_state(tmp_path)
    set_rng_state(state["rng"])
    assert state["step"] == 2 and np.random.rand() == expected
