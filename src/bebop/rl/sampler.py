"""Problems -> RolloutBatch with the engine: plain decoding or speculative (TO / RS) with the head.

    sampler = RolloutSampler(task, policy, cfg)
    batch = sampler.collect(model, index=step, policy_version=v)   # batch_prompts * G rollouts

The prompt stream is a pure function of (seed, index): batch `index` holds `batch_prompts` train
problems drawn with seed (seed, index) (rows of a --data file: the next `batch_prompts` of its
shuffled epochs), each repeated G times, and is sampled with a generator
seeded the same way; resuming at a data position regenerates exactly the batches not yet trained.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import TYPE_CHECKING

import torch

from bebop.decoding import auto_controller, generate_fn
from bebop.engine.adaptive import AdaptiveK
from bebop.engine.compiled import compile_steps, expected_decode_steps
from bebop.engine.metrics import SpecMetrics, merged
from bebop.engine.records import TRUNCATED
from bebop.engine.suffix_drafter import index_for
from bebop.engine.suffix_index import SuffixIndex
from bebop.model.qwen3 import CausalLM
from bebop.policy import Policy
from bebop.precision import DTYPES
from bebop.rl.config import RLConfig
from bebop.rl.records import Rollout, RolloutBatch
from bebop.rollout import encode_prompts, run_episodes, summarize
from bebop.tasks import Problem, Task
from bebop.tasks.dataset_task import DatasetTask

if TYPE_CHECKING:
    from bebop.vllm.serve import VllmServer

STREAM_STRIDE = 1_000_003  # seeds of batch i: seed * STREAM_STRIDE + i (distinct across seeds and batches)


class RolloutSampler:
    def __init__(self, task: Task, policy: Policy, cfg: RLConfig) -> None:
        """`policy` gives the tokenizer and the stop ids (generation_config.json's too); its model is not kept:
        each call samples from the model it is given (a Ray worker's, an async engine copy)."""
        self.task, self.codec, self.cfg = task, policy.codec, cfg
        self.generation_stop_ids = policy.generation_stop_ids
        self.controller: AdaptiveK | None = None
        self.suffix_index: SuffixIndex | None = None  # with --drafter suffix: the run's rollouts, kept across steps
        self.rollout_copy: CausalLM | None = None  # the model in --rollout-dtype, when it is not the trainer's
        self.drafting_suspended = False  # set while the drafter alarm is up (rl/drafter_alarm.py)
        self.vllm: VllmServer | None = None  # with --engine vllm: the server rollouts run on (rl/vllm_source.py)

    def __getstate__(self) -> dict:
        """A sampler travels to Ray workers without its rollout copy (each worker makes its own)."""
        return {**self.__dict__, "rollout_copy": None, "vllm": None}

    def rollout_model(self, model: CausalLM) -> CausalLM:
        """The model rollouts run on: `model` itself, or its copy in --rollout-dtype with `model`'s weights now;
        its decoding steps compiled when --compile says so (once: the graphs see later weights in place)."""
        engine = self._in_rollout_dtype(model)
        cfg = self.cfg
        engine.state_dtype = DTYPES[cfg.state_dtype]  # its caches' recurrent states (the trainer's rule: float32)
        per_step = expected_decode_steps(cfg.batch_prompts * cfg.group_size, cfg.batch_size, cfg.max_new_tokens)
        compile_steps(engine, cfg.decode.compile, cfg.steps * per_step)
        return engine

    def _in_rollout_dtype(self, model: CausalLM) -> CausalLM:
        dtype = DTYPES[self.cfg.rollout_dtype]
        if model.dtype == dtype:
            return model
        with torch.no_grad():
            if self.rollout_copy is None:
                state = {name: t.detach().to(dtype) if t.is_floating_point() else t.detach().clone()
                         for name, t in model.state_dict().items()}
                self.rollout_copy = CausalLM.from_state_dict(model.config, state).to(model.device).eval()
                self.rollout_copy.requires_grad_(False)
            else:
                weights = model.state_dict()
                for name, t in self.rollout_copy.state_dict().items():
                    t.copy_(weights[name])  # cast to the copy's dtype
        return self.rollout_copy

    def _controller(self, model: CausalLM, rows: int) -> AdaptiveK | None:
        """With --k auto, one controller for the run: its acceptance estimate follows the policy."""
        if self.controller is None:
            self.controller = auto_controller(model, self.cfg.decode, min(rows, self.cfg.batch_size), self.cfg.sampling)
        if self.controller is not None:
            self.controller.suspended = self.drafting_suspended
        return self.controller

    def generate_fn(self, model: CausalLM, rows: int, sink: list[SpecMetrics]):
        """The engine the run's rollouts use: vLLM's, or bebop's plain or drafting with the head (metrics to `sink`)."""
        if self.vllm is not None:
            return self.vllm.engine
        if self.suffix_index is None:  # earlier steps' responses draft for later ones (every epoch)
            self.suffix_index = index_for(self.cfg.decode.drafter, None)
        return generate_fn(self.cfg.decode, sink, self._controller(model, rows), self.suffix_index)

    def batch_seed(self, index: int) -> int:
        return self.cfg.seed * STREAM_STRIDE + index

    def problems(self, index: int) -> list[Problem]:
        """The batch's problems, each repeated group_size times (group-major)."""
        if isinstance(self.task, DatasetTask):  # your own rows: epoch after shuffled epoch
            drawn = self.task.batch(index, self.cfg.batch_prompts, self.cfg.seed)
        else:
            drawn = self.task.problems("train", self.cfg.batch_prompts, self.batch_seed(index))
        return [p for p in drawn for _ in range(self.cfg.group_size)]

    def check_expressible(self, policy: Policy) -> None:
        """Fail early, on the caller's thread, when the tokenizer cannot express the task's prompts."""
        encode_prompts(policy, self.problems(0))

    def collect(self, model: CausalLM, *, index: int, policy_version: int) -> RolloutBatch:
        cfg = self.cfg
        t0 = time.perf_counter()  # rollout_s includes syncing the rollout copy
        model = self.rollout_model(model) if self.vllm is None else model
        policy = Policy(model, self.codec, generation_stop_ids=self.generation_stop_ids)  # stop ids: Policy.stop_ids
        problems = self.problems(index)
        sink: list[SpecMetrics] = []
        generate_fn = self.generate_fn(model, len(problems), sink)
        generator = torch.Generator(device=model.device).manual_seed(self.batch_seed(index))
        was_training = model.training
        model.eval()
        errors_before = self.reward_errors
        counting = (self.vllm.engine.counting(cfg.draft_depths, sink)  # vLLM's own acceptance counters, into sink
                    if self.vllm is not None and cfg.decode.drafts else nullcontext())
        with counting:
            episodes = run_episodes(policy, self.task, problems, sampling=cfg.sampling,
                                    max_new_tokens=cfg.max_new_tokens, generator=generator, batch_size=cfg.batch_size,
                                    generate_fn=generate_fn)
        rollout_s = time.perf_counter() - t0
        model.train(was_training)
        rollouts = [Rollout(ep.generation.prompt_ids, ep.generation.token_ids, ep.generation.logprobs,
                            ep.generation.policy_mask, ep.reward, policy_version,
                            truncated=ep.generation.finish_reason in TRUNCATED,
                            target_forwards=ep.generation.forwards,
                            drafts_by_source=ep.generation.drafts_by_source) for ep in episodes]
        summary = summarize(episodes)
        return RolloutBatch(rollouts, cfg.group_size, policy_version, index, rollout_s,
                            merged(sink, cfg.draft_depths) if sink else None, summary["pass_rate"], summary["mean_entropy"],
                            reward_errors=self.reward_errors - errors_before)

    @property
    def reward_errors(self) -> int:
        """Reward calls of this sampler's task that failed so far (a dataset's; generated tasks never fail)."""
        return self.task.reward_errors if isinstance(self.task, DatasetTask) else 0
