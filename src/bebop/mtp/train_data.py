"""The head's training sequences: given rollouts (any engine's), or the policy's own samples (self-distillation,
cached; sampled by the engine bebop.decoding opens, rank 0 first under several ranks) plus demonstrations, and the
samples kept out of training for the held-out measure."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path

from bebop.decoding import DecodeSpec, open_engine
from bebop.distributed.world import World
from bebop.encoding import env_token_mask
from bebop.mtp.data import SAMPLE_BATCH, Sequence, demonstration_data, selfdistill_data
from bebop.mtp.rollout_files import read_rollouts
from bebop.mtp.train_config import MTPTrainConfig
from bebop.policy import Policy
from bebop.sampling import SamplingParams
from bebop.tasks.dataset_task import COMPLETIONS, PROMPTS, run_task


def load_data(policy: Policy, cfg: MTPTrainConfig, cache_dir: Path, progress: bool,
              open_engine: Callable[[], AbstractContextManager] | None = None) -> list[Sequence]:
    """The training sequences: given rollouts, or the policy's samples (cached; sampled through `open_engine()`
    on a miss, bebop's engine by default) plus demonstrations."""
    if cfg.rollouts:  # the given token ids, no sampling; environment observations found by their markers
        return [Sequence(r.prompt_ids, r.response_ids, env_token_mask(r.response_ids, policy.codec))
                for r in read_rollouts(cfg.rollouts, policy)]
    need = COMPLETIONS if cfg.num_demos else PROMPTS  # demonstrations from a file are its completions
    task = run_task(policy, task=cfg.task, difficulty=1, data=cfg.data, need=need)
    data = []
    if cfg.num_samples:
        data += selfdistill_data(policy, task, n=cfg.num_samples, temperature=cfg.temperature, seed=cfg.seed,
                                 cache_dir=cache_dir, max_new_tokens=cfg.max_new_tokens, progress=progress,
                                 engine=cfg.engine, open_engine=open_engine)
    if cfg.num_demos:
        data += demonstration_data(policy, task, n=cfg.num_demos, seed=cfg.seed)
    return data


def sampler_opener(policy: Policy, model_dir: Path, cfg: MTPTrainConfig, vllm: DecodeSpec | None):
    """What opens the engine that samples self-distillation (bebop's, eager; or a vLLM worker, `vllm` carrying its
    Python and timeout), on a cache miss."""
    spec = replace(vllm or DecodeSpec(), engine=cfg.engine, compile="off")
    return lambda: open_engine(policy, spec, model_dir=model_dir, rows=cfg.num_samples, batch_size=SAMPLE_BATCH,
                               max_new_tokens=cfg.max_new_tokens, sampling=SamplingParams(cfg.temperature),
                               seed=cfg.seed)


def split_held_out(data: list[Sequence], cfg: MTPTrainConfig) -> tuple[list[Sequence], list[Sequence]]:
    """(training sequences, held-out ones): the last --held-out self-distillation samples are held out."""
    if not cfg.held_out:
        return data, []
    cut = cfg.num_samples - cfg.held_out  # the samples come first, demonstrations after them
    return data[:cut] + data[cfg.num_samples:], data[cut: cfg.num_samples]


def load_data_ranked(policy: Policy, cfg: MTPTrainConfig, model_dir: Path, data_cache: str | Path | None,
                      progress: bool, vllm: DecodeSpec | None, world: World) -> list[Sequence]:
    """The training sequences; with several ranks, rank 0 samples (and caches) them first, then the others read."""
    cache = Path(data_cache or model_dir / "mtp_data")
    opener = sampler_opener(policy, model_dir, cfg, vllm)
    data = load_data(policy, cfg, cache, progress, opener) if world.is_main else []
    world.barrier()
    return data if world.is_main else load_data(policy, cfg, cache, False, opener)
