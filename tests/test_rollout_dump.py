"""Rollout records (issue 16, part 4): RUN_DIR/rollouts/step-N.jsonl per step, off with a flag;
each response's acceptance length from the engine's per-row count of target forwards."""

import json

import pytest
import torch

from bebop.cli import main
from bebop.engine import generate
from bebop.engine import speculative as spec
from bebop.policy import load_policy
from bebop.rl import train_rl
from bebop.rl.rollout_dump import rollout_path
from bebop.sampling import SamplingParams

from rl_helpers import read_metrics, rl_cfg
from spec_helpers import PROMPTS, ids_of, oracle_drafter


def test_every_step_is_dumped_with_its_responses(headed, digit_reward, tmp_path):
    run = tmp_path / "run"
    train_rl(run, rl_cfg(headed, spec="rs", k=2, steps=2), progress=False, device="cpu")
    metrics = read_metrics(run)
    codec = load_policy(headed, device="cpu").codec
    for m in metrics:
        rows = [json.loads(x) for x in rollout_path(run, m["step"]).read_text().splitlines()]
        assert len(rows) == 2 * 2 and [r["index"] for r in rows] == [0, 1, 2, 3]
        assert [r["group"] for r in rows] == [0, 0, 1, 1] and {r["step"] for r in rows} == {m["step"]}
        assert sum(r["reward"] for r in rows) / len(rows) == pytest.approx(m["reward"])
        assert {r["policy_version"] for r in rows} == {m["policy_version"]}
        assert sum(r["policy_tokens"] for r in rows) == m["generated_tokens"]
        assert all(r["acceptance_length"] >= 1.0 for r in rows)
        assert all(codec.encode(r["prompt"]) and isinstance(r["completion"], str) for r in rows)
        assert all(codec.decode(r["prompt_ids"]) == r["prompt"] and codec.decode(r["response_ids"]) == r["completion"]
                   for r in rows)  # the ids `bebop mtp diagnose` reads


def test_the_flag_turns_it_off(headed, digit_reward, tmp_path, capsys):
    run = tmp_path / "run"
    train_rl(run, rl_cfg(headed, steps=1, dump_rollouts=False), progress=False, device="cpu")
    assert (run / "metrics.jsonl").is_file() and not (run / "rollouts").exists()
    with pytest.raises(SystemExit) as exit_info:  # argparse's usage error
        main(["rl", "--model", str(headed), "--steps", "1", "--out", str(tmp_path / "r2"), "--dump-rollouts", "maybe"])
    assert exit_info.value.code == 2 and "expected on or off, got 'maybe'" in capsys.readouterr().err


def test_forwards_per_row_give_the_acceptance_length(spec_model, monkeypatch):
    prompts = ids_of(PROMPTS)
    plain = generate(spec_model, prompts, max_new_tokens=12, sampling=SamplingParams(0.0))
    assert all(g.forwards == len(g.token_ids) for g in plain)  # one token per forward
    monkeypatch.setattr(spec, "_draft", oracle_drafter(spec_model, prompts, corrupt=0.0, seed=0))
    gens, metrics = spec.speculative_generate(spec_model, prompts, k=3, mode="rs", max_new_tokens=12,
                                              sampling=SamplingParams(0.0), generator=torch.Generator().manual_seed(0))
    assert metrics.acceptance_rate == 1.0
    # the prefill emits one token; then each verify emits 4 (3 accepted drafts + the bonus), the last one cut
    assert all(g.forwards == 1 + -(-(len(g.token_ids) - 1) // 4) for g in gens)
    assert all(g.forwards < len(g.token_ids) for g in gens)


@pytest.mark.parametrize("spec_mode", ["off", "rs"])
def test_acceptance_lengths_of_more_than_8_rows_with_stop_tokens(turn_model, tmp_path, monkeypatch, spec_mode):
    """16 rows, most stopping early (issue 23): the finished ones ride along in the batch and must count
    no forward, so every dumped acceptance length is policy tokens / target forwards, at least 1 (plain: 1)."""
    from rl_helpers import spy_rollouts

    rollouts = spy_rollouts(monkeypatch)
    run = tmp_path / "run"
    train_rl(run, rl_cfg(turn_model, spec=spec_mode, k=2, steps=1, group_size=4, batch_prompts=4,
                         max_new_tokens=24), progress=False, device="cpu")
    rows = [json.loads(x) for x in rollout_path(run, 1).read_text().splitlines()]
    assert len(rows) == len(rollouts) == 16 and len({r.target_forwards for r in rollouts}) > 2
    for row, r in zip(rows, rollouts):
        assert row["acceptance_length"] == pytest.approx(r.num_policy_tokens / r.target_forwards, abs=1e-4)
        assert row["acceptance_length"] >= 1 and (spec_mode == "rs" or row["acceptance_length"] == 1)
