"""Shared pieces of the RL tests: a tiny headed policy, a reward that varies on a random policy,
a small RLConfig, the metrics of a run."""

import json
import shutil
import threading
import time

import torch

from bebop.fields import from_flat
from bebop.model import load_model
from bebop.model.checkpoint import save_model
from bebop.rl import RLConfig
from bebop.rl.records import RolloutBatch
from bebop.rl.sampler import RolloutSampler

TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
            head_dim=16, max_position_embeddings=256)


def make_headed(path, tiny_root):
    """A tiny random policy (near-uniform next-token distributions) with a fresh MTP head."""
    from bebop.embedded import init_model_dir

    init_model_dir(tiny_root, seed=0, **TINY)
    model = load_model(tiny_root)
    model.attach_mtp(1, torch.Generator().manual_seed(0))
    save_model(model, path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (path / name).write_text((tiny_root / name).read_text())
    return path


class DigitTask:
    """A task wrapper whose reward varies on a random policy (>= 2 digits in the completion), so
    groups have nonzero advantages and the update really moves the weights."""

    def __init__(self, inner):
        self.inner, self.name = inner, inner.name

    def problems(self, split, n, seed):
        return self.inner.problems(split, n, seed)

    def demonstration(self, problem, rng):
        return self.inner.demonstration(problem, rng)

    def observe(self, problem, transcript):
        return self.inner.observe(problem, transcript)

    def score(self, problem, completion):
        return float(sum(ch.isdigit() for ch in completion) >= 2)


class VariedReward(DigitTask):
    """A reward that differs between any two samples (the share of distinct characters): every group has
    advantages, so each update moves the weights."""

    def score(self, problem, completion):
        return len(set(completion)) / max(len(completion), 1)


class SlowSampler(RolloutSampler):
    """Takes `delay_s` per batch, so a rollout worker can be killed mid-batch."""

    delay_s = 1.0

    def collect(self, model, *, index, policy_version):
        time.sleep(self.delay_s)
        return super().collect(model, index=index, policy_version=policy_version)


def rl_cfg(model, **kw):
    base = dict(model=str(model), task="math", steps=2, group_size=2, batch_prompts=2, max_new_tokens=16, lr=1e-3,
                save_every=1)
    base.update(kw)
    return from_flat(RLConfig, base)  # the decoding settings (spec=, k=, ...) flat, as flags give them


def read_metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


class GatedSampler:
    """Returns empty batches; batch i is held until the test releases it."""

    def __init__(self, n=6):
        self.started = [threading.Event() for _ in range(n)]
        self.release = [threading.Event() for _ in range(n)]

    def collect(self, model, *, index, policy_version):
        self.started[index].set()
        assert self.release[index].wait(10)
        return RolloutBatch([], 2, policy_version, index, 0.0, None, 0.0, 0.0)


TURN_ENDS = "aeiou "  # listed as eos only in generation_config.json


def make_turn_model(headed, path):
    """`headed` whose generation_config.json (only) lists TURN_ENDS' characters as end-of-turn ids."""
    from bebop.policy import load_policy

    shutil.copytree(headed, path)
    codec = load_policy(path, device="cpu").codec
    ids = [codec.encode(ch)[0] for ch in TURN_ENDS]
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": ids}))
    return path


def spy_rollouts(monkeypatch) -> list:
    """The rollouts an RL run trains on, as the driver dumps them (every step's batch, Ray's included)."""
    import bebop.rl.loop

    seen: list = []
    real = bebop.rl.loop.dump_rollouts

    def spy(run_dir, step, batch, codec):
        seen.extend(batch.rollouts)
        return real(run_dir, step, batch, codec)

    monkeypatch.setattr(bebop.rl.loop, "dump_rollouts", spy)
    return seen


def check_rollouts_end_their_turn(rollouts, model_dir) -> None:
    """No rollout generates past a TURN_ENDS id (the policy's tokens; the environment's may hold any), and
    most stopped at one: a check that would fail if the run ignored generation_config.json."""
    from bebop.policy import generation_stop_ids

    ends = set(generation_stop_ids(model_dir))
    assert len(rollouts) >= 8
    for r in rollouts:
        policy_tokens = [t for t, is_policy in zip(r.token_ids, r.policy_mask) if is_policy]
        assert not ends & set(policy_tokens[:-1]), f"generated past the end of its turn: {r.token_ids}"
    assert sum(r.token_ids[-1] in ends for r in rollouts) >= len(rollouts) // 2
