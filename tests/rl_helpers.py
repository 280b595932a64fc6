"""Shared pieces of the RL tests: a tiny headed policy, a reward that varies on a random policy,
a small RLConfig, the metrics of a run."""

import json
import threading

import torch

from bebop.model import load_model
from bebop.model.checkpoint import save_model
from bebop.rl import RLConfig
from bebop.rl.records import RolloutBatch

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


def rl_cfg(model, **kw):
    base = dict(model=str(model), task="math", steps=2, group_size=2, batch_prompts=2, max_new_tokens=16, lr=1e-3,
                save_every=1)
    base.update(kw)
    return RLConfig(**base)


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
