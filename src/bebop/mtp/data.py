"""Self-distillation data for MTP training: the policy's own samples, cached on disk.

    seqs = selfdistill_data(policy, task, n=512, temperature=1.0, seed=0, cache_dir=DIR)

Generated with the engine from the task's train prompts at the given temperature (agent
observations come from the environment, as in RL). Cached as JSONL under `cache_dir`, keyed by
(task, n, temperature, seed, max_new_tokens) and stamped with a fingerprint of the tokenizer; a
cache made with another tokenizer is an error, not silent garbage. Demonstrations can be mixed in.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from bebop.encoding import encode_example, env_token_mask
from bebop.engine import generate
from bebop.errors import BebopError
from bebop.jsonl import read_jsonl, write_jsonl
from bebop.policy import Policy
from bebop.progress import bar as progress_bar
from bebop.rollout import run_episodes
from bebop.sampling import SamplingParams
from bebop.tasks import Task
from bebop.tasks.dataset_task import DatasetTask

SAMPLE_BATCH = 64  # rows per engine call while sampling


@dataclass
class Sequence:
    """One training sequence: prompt then completion tokens, with the environment's tokens marked."""

    prompt_ids: list[int]
    completion_ids: list[int]
    env_mask: list[bool]  # per completion token: True where the environment wrote it

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.completion_ids


def tokenizer_fingerprint(policy: Policy) -> str:
    return hashlib.sha256(policy.codec.tokenizer.to_str().encode()).hexdigest()[:16]


def _cache_path(cache_dir: Path, task: Task, n: int, temperature: float, seed: int, max_new_tokens: int,
                engine: str = "bebop") -> Path:
    name = f"{task.name}-{task.fingerprint}" if isinstance(task, DatasetTask) else task.name  # two files, one name
    by = "" if engine == "bebop" else f"-{engine}"  # another engine's samples are other samples
    return cache_dir / f"{name}-n{n}-T{temperature:g}-s{seed}-m{max_new_tokens}{by}.jsonl"


def load_sequences(path: Path, policy: Policy) -> list[Sequence]:
    rows = read_jsonl(path, required=("prompt_ids", "completion_ids", "env_mask"))
    want = tokenizer_fingerprint(policy)
    vocab = policy.model.config.vocab_size
    for i, row in enumerate(rows, start=1):
        if row.get("tokenizer") != want:
            raise BebopError(f"{path}: row {i} was made with another tokenizer (fingerprint "
                             f"{row.get('tokenizer')!r}, this model's is {want!r}); delete the file to regenerate")
        if any(not 0 <= t < vocab for t in row["prompt_ids"] + row["completion_ids"]):
            raise BebopError(f"{path}: row {i} has token ids outside the model's vocabulary [0, {vocab})")
    return [Sequence(r["prompt_ids"], r["completion_ids"], r["env_mask"]) for r in rows]


def selfdistill_data(policy: Policy, task: Task, *, n: int, temperature: float, seed: int, cache_dir: str | Path,
                     max_new_tokens: int = 192, batch_size: int = SAMPLE_BATCH, progress: bool = True, engine: str = "bebop",
                     open_engine: Callable[[], AbstractContextManager] | None = None) -> list[Sequence]:
    """The policy's samples, cached; on a miss `open_engine()` gives the generate function to sample with (opened
    only then: a vLLM worker for --engine vllm; bebop.decoding.open_engine)."""
    path = _cache_path(Path(cache_dir), task, n, temperature, seed, max_new_tokens, engine)
    if path.is_file():
        return load_sequences(path, policy)
    with (open_engine or (lambda: nullcontext(generate)))() as generate_fn:
        seqs = sample_sequences(policy, task, n=n, temperature=temperature, seed=seed, max_new_tokens=max_new_tokens,
                                batch_size=batch_size, progress=progress, generate_fn=generate_fn)
    save_sequences(path, policy, seqs)
    return seqs


def save_sequences(path: Path, policy: Policy, seqs: list[Sequence]) -> None:
    """seqs as JSONL (atomic), stamped with the tokenizer's fingerprint (load_sequences checks it)."""
    fp = tokenizer_fingerprint(policy)
    write_jsonl(path, [{"prompt_ids": s.prompt_ids, "completion_ids": s.completion_ids, "env_mask": s.env_mask,
                        "tokenizer": fp} for s in seqs])


def sample_sequences(policy: Policy, task: Task, *, n: int, temperature: float, seed: int, split: str = "train",
                     max_new_tokens: int = 192, batch_size: int = SAMPLE_BATCH, progress: bool = True,
                     generate_fn=generate) -> list[Sequence]:
    """The policy's own completions of n `split` problems at `temperature` (seeded), not cached."""
    problems = task.problems(split, n, seed)
    generator = torch.Generator(device=policy.model.device).manual_seed(seed)
    with progress_bar(total=n, desc=f"sample {task.name} T={temperature:g}", unit="row", enabled=progress) as bar:
        episodes = run_episodes(policy, task, problems, sampling=SamplingParams(temperature),
                                max_new_tokens=max_new_tokens, generator=generator, batch_size=batch_size,
                                on_batch=bar.update, generate_fn=generate_fn)
    return [Sequence(policy.codec.encode(ep.problem.prompt), ep.generation.token_ids,
                     [not m for m in ep.generation.policy_mask]) for ep in episodes]


def demonstration_data(policy: Policy, task: Task, *, n: int, seed: int) -> list[Sequence]:
    rng = random.Random(seed)
    out = []
    for problem in task.problems("train", n, seed):
        ids, _ = encode_example(policy.codec, problem.prompt, task.demonstration(problem, rng),
                                policy.model.config.max_position_embeddings)
        p_len = len(policy.codec.encode(problem.prompt))
        completion = ids[p_len:]
        out.append(Sequence(ids[:p_len], completion, env_token_mask(completion, policy.codec)))
    return out
