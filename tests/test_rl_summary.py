"""The numbers of `bebop rl`'s summary (bebop.rl.summary): the mean of the last 5 steps, rounded, named so."""

from __future__ import annotations

from bebop.rl.summary import last_steps_means


def test_the_mean_of_the_last_five_steps_rounded_to_four_digits():
    rows = [{"reward": 100.0, "mean_acceptance_length": 9.0}] + \
           [{"reward": r, "mean_acceptance_length": a} for r, a in [(0.1, 1.5), (0.2, 1.5), (0.3, 2.0), (0.4, 2.0),
                                                                     (1 / 3, 2.123456)]]
    means = last_steps_means(rows)  # the first row is outside the window
    assert means == {"reward_mean_last5": 0.2667, "mean_acceptance_length_mean_last5": 1.825}


def test_fewer_steps_than_the_window_and_none():
    assert last_steps_means([{"reward": 0.5, "mean_acceptance_length": 1.0}]) == \
        {"reward_mean_last5": 0.5, "mean_acceptance_length_mean_last5": 1.0}
    assert last_steps_means([]) == {"reward_mean_last5": None, "mean_acceptance_length_mean_last5": None}


def test_a_resumed_run_summarises_the_steps_before_the_resume(headed, tmp_path, digit_reward):
    from bebop.rl.loop import train_rl

    from rl_helpers import read_metrics, rl_cfg

    cfg = rl_cfg(headed, steps=2, spec="off", mtp_update="none")
    first = train_rl(tmp_path / "run", cfg, progress=False, device="cpu")
    rows = read_metrics(tmp_path / "run")
    assert first["reward_mean_last5"] == last_steps_means(rows)["reward_mean_last5"]
    again = train_rl(tmp_path / "run", cfg, resume=True, progress=False, device="cpu")  # nothing left to run
    memory = ("peak_memory_mb", "state_mb")  # this process's, measured when each call ends its steps
    assert {k: v for k, v in again.items() if k not in memory} == {k: v for k, v in first.items() if k not in memory}
    assert again["state_mb"] == first["state_mb"] and again["peak_memory_mb"][0] > 0
