"""The warning when an RL run's first steps give GRPO no advantage (bebop.rl.flat_rewards), and the run as a
user meets it: `bebop rl` on an untrained policy, stderr to a file."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from types import SimpleNamespace

from bebop.cli import main
from bebop.progress import INTERVAL_S
from bebop.rl.flat_rewards import FlatRewards

from rl_helpers import rl_cfg


def batch(*groups: list[float]) -> SimpleNamespace:
    """A stand-in RolloutBatch: its rewards, group-major, and the group size."""
    return SimpleNamespace(rewards=[r for g in groups for r in g], group_size=len(groups[0]))


def test_warns_once_when_every_watched_step_is_flat():
    watch = FlatRewards(rl_cfg("runs/policy"), steps=3)
    assert watch.observe(batch([0, 0], [0, 0])) is None
    assert watch.observe(batch([0, 0], [0, 0])) is None
    message = watch.observe(batch([0, 0], [0, 0]))
    assert message.startswith("bebop: warning: in the run's first 3 steps every reward was 0: no advantage")
    assert "`bebop sft --task math --out DIR`" in message
    assert watch.observe(batch([0, 0], [0, 0])) is None  # once


def test_groups_that_agree_within_but_not_across_are_still_flat():
    watch = FlatRewards(rl_cfg("runs/policy", data="rows.jsonl"), steps=1)
    message = watch.observe(batch([1, 1], [0, 0]))
    assert "every group's rewards were equal" in message and "--data FILE --model runs/policy" in message
    assert "--difficulty" not in message  # a --data run has none


def test_one_step_with_an_advantage_ends_the_watch():
    watch = FlatRewards(rl_cfg("runs/policy"), steps=2)
    assert watch.observe(batch([0, 0], [0, 1])) is None
    assert watch.observe(batch([0, 0], [0, 0])) is None
    assert watch.observe(batch([0, 0], [0, 0])) is None
    assert FlatRewards(rl_cfg("runs/policy"), steps=0).observe(batch([0, 0])) is None  # nothing left to run


RL = ["rl", "--task", "math", "--steps", "3", "--group-size", "2", "--batch-prompts", "2", "--max-new-tokens", "8",
      "--spec", "off", "--mtp-update", "none", "--device", "cpu"]


def test_rl_into_a_file_prints_plain_lines_and_the_warning(headed, tmp_path):
    log = tmp_path / "stderr.log"
    t0 = time.monotonic()
    with log.open("w") as err:  # stderr is a file, not a terminal
        done = subprocess.run([sys.executable, "-m", "bebop", *RL, "--model", str(headed), "--out",
                               str(tmp_path / "run")], stdout=subprocess.PIPE, stderr=err, text=True, timeout=300)
    elapsed = time.monotonic() - t0
    text = log.read_bytes().decode()  # not read_text: universal newlines would turn each '\r' into a '\n'
    assert done.returncode == 0, text
    assert "\r" not in text
    bars = [line for line in text.splitlines() if line.startswith("rl math sync: ")]
    assert bars[0].startswith("rl math sync: 0/3") and bars[-1].startswith("rl math sync: 3/3")
    assert 2 <= len(bars) <= 2 + elapsed / INTERVAL_S  # the start, the end, at most one per interval between
    assert text.count("bebop: warning: in the run's first 3 steps every reward was 0") == 1  # a random policy
    summary = json.loads(done.stdout)
    assert summary["steps"] == 3 and "reward_last" not in summary
    assert summary["reward_mean_last5"] == 0.0 and summary["mean_acceptance_length_mean_last5"] == 1.0  # spec off


def test_no_progress_prints_no_bar_but_still_warns(headed, tmp_path, capsys):
    assert main([*RL, "--model", str(headed), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "rl math" not in err
    assert err.count("bebop: warning: in the run's first 3 steps") == 1
