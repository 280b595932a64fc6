"""One source of stop ids (issue 23): every path that generates stops on the tokenizer's eos, the
config's and generation_config.json's. A base Qwen3 lists its end of turn (<|im_end|>) only in
generation_config.json; here that file lists a few frequent characters of a tiny random policy, so a
path that ignored it would run past them in most rollouts."""

from __future__ import annotations

from bebop.mtp.data import sample_sequences
from bebop.policy import load_policy
from bebop.rl import train_rl
from bebop.tasks import get_task

from rl_helpers import TURN_ENDS, check_rollouts_end_their_turn, rl_cfg, spy_rollouts


def test_rl_rollouts_stop_at_generation_config_ids(turn_model, tmp_path, monkeypatch):
    rollouts = spy_rollouts(monkeypatch)
    cfg = rl_cfg(turn_model, steps=1, batch_prompts=4, max_new_tokens=24, spec="rs", k=2)
    train_rl(tmp_path / "run", cfg, progress=False)
    check_rollouts_end_their_turn(rollouts, turn_model)


def test_async_rl_rollouts_stop_at_generation_config_ids(turn_model, tmp_path, monkeypatch):
    rollouts = spy_rollouts(monkeypatch)
    cfg = rl_cfg(turn_model, steps=1, batch_prompts=4, max_new_tokens=24, mode="async")
    train_rl(tmp_path / "run", cfg, progress=False)
    check_rollouts_end_their_turn(rollouts, turn_model)


def test_self_distillation_samples_stop_at_generation_config_ids(turn_model):
    policy = load_policy(turn_model, device="cpu")
    ends = {policy.codec.encode(ch)[0] for ch in TURN_ENDS}
    seqs = sample_sequences(policy, get_task("math"), n=8, temperature=1.0, seed=0, split="train", max_new_tokens=24,
                            progress=False)
    assert all(not ends & set(seq.completion_ids[:-1]) for seq in seqs)
    assert sum(seq.completion_ids[-1] in ends for seq in seqs) >= 4
