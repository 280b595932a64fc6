"""The resolved configuration of one RL run (written to RUN_DIR/config.json, checked on resume), and
where its rollouts run (Backend: not part of the run's identity, like the device)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bebop.chat import TEMPLATE_KWARGS_HELP, parse_template_kwargs
from bebop.decoding import DecodeSpec
from bebop.errors import BebopError
from bebop.fields import group, leaf_fields, opt, parse_switch
from bebop.precision import DTYPES, TRAIN_DTYPES, check_train_dtype
from bebop.sampling import SamplingParams
from bebop.tasks import TASK_LIST, get_task

MODES = ("sync", "async")
MTP_UPDATES = ("none", "ce", "tv", "e2e_tv")  # "none" keeps the pre-RL head frozen; others name a draft loss
BACKENDS = ("local", "ray")


@dataclass(frozen=True)
class RLConfig:
    model: str = opt("", "the starting policy directory, with an MTP head for --spec (also the KL reference)")
    task: str = opt("math", f"{TASK_LIST} (or --data FILE)")
    data: str = opt("", "your own prompts: a JSONL or parquet file in verl's or TRL's layout, instead of --task")
    reward: str = opt("", "with --data: math, module:function or path/to/file.py:function, called as "
                      "fn(data_source, solution_str, ground_truth, extra_info) (default: by each row's data_source)")
    chat_template_kwargs: str = opt("", TEMPLATE_KWARGS_HELP)
    eval_data: str = opt("", "held-out prompts (JSONL or parquet, as --data), scored every --eval-every steps")
    eval_every: int = opt(10, "steps between evaluations on --eval-data (and after the last step)")
    steps: int = opt(50, "policy updates (GRPO steps)")
    mode: str = opt("sync", "sync, or async: the next batch is sampled while this one trains "
                    "(default with --backend ray: async)", choices=MODES)
    mtp_update: str = opt("none", "online MTP strategy during RL (none keeps the pre-RL head frozen)",
                          choices=MTP_UPDATES)
    group_size: int = opt(4, "G: samples per prompt (>= 2)")
    batch_prompts: int = opt(8, "prompts per step")
    max_new_tokens: int = opt(384, "per response (room for the long tail: the longest math demonstrations "
                                   "are about 340 tokens)")
    temperature: float = opt(1.0, "sampling temperature (> 0)")
    top_k: int = opt(0, "0 = off; the trainer's log-probs use the same warping")
    top_p: float = opt(1.0, "1.0 = off; the trainer's log-probs use the same warping")
    lr: float = opt(3e-5, "policy learning rate (AdamW)")
    weight_decay: float = opt(0.0, "policy AdamW weight decay")
    grad_clip: float = opt(1.0, "policy gradient-norm clip")
    clip_eps: float = opt(0.2, "PPO clip of the ratio to the log-probs at the start of the update")
    clip_eps_high: float = opt(0.0, "DAPO's Clip-Higher: the ratio's upper clip is 1 + this, the lower stays "
                               "1 - --clip-eps (0 = the same as --clip-eps; DAPO uses 0.28 with 0.2)")
    ppo_epochs: int = opt(1, "passes over each batch (> 1, or --mini-batches > 1, lets --clip-eps act)")
    mini_batches: int = opt(1, "optimizer steps per pass, each on a random share of the batch's rollouts")
    micro_batch_size: int = opt(8, "rows per forward and backward of the update (0 = each optimizer step's rows "
                                "at once): gradients accumulate to the same step in less memory. Each micro-batch "
                                "is packed: a group's rows together, its prompt run once, no padding (a multiple of "
                                "--group-size runs every prompt once; docs/benchmarks.md)")
    kl_coef: float = opt(0.0, "k3 KL to the starting policy (0 = off: no reference copy is kept)")
    entropy_coef: float = opt(0.0, "entropy bonus: the loss subtracts this x the trainer's mean entropy over policy "
                              "tokens, with gradient (0 = off: the entropy stays detached, no extra work)")
    is_cap: float = opt(2.0, "truncation of the importance weights against the sampler's log-probs")
    max_staleness: int = opt(1, "async: the most policy versions a batch may lag (0 = on-policy lock-step)")
    mtp_lr: float = opt(1e-4, "online MTP learning rate")
    mtp_grad_clip: float = opt(1.0, "online MTP gradient-norm clip")
    seed: int = opt(0, "seeds the prompt stream, sampling and mini-batch order")
    difficulty: int = opt(1, "task difficulty 1 (easiest) .. 3")
    save_every: int = opt(10, "steps between resumable checkpoints")
    batch_size: int = opt(64, "engine rows per generate call")
    rollout_threads: int = opt(0, "async: torch threads of the rollout worker (0 = torch's default)")
    train_threads: int = opt(0, "async: torch threads of the trainer (0 = torch's default)")
    dtype: str = opt("float32", "training precision: float32, or bfloat16 mixed precision (float32 weights "
                     "and AdamW state; rollouts stay in the model's dtype)", choices=TRAIN_DTYPES)
    rollout_dtype: str = opt("float32", "the sampler's dtype: float32, or bfloat16 (a bfloat16 copy of the float32 "
                             "trainer's weights, synced every batch; the truncated importance weight corrects the "
                             "difference, sampler_kl in metrics.jsonl measures it)", choices=DTYPES)
    state_dtype: str = opt("float32", "what a hybrid sampler's caches keep its linear layers' recurrent states in: "
                           "float32, or bfloat16 (half the memory traffic a decode step makes, as vLLM keeps them "
                           "by default; the rule computes in float32 either way)", choices=DTYPES)
    dump_rollouts: bool = opt(True, "write every step's responses to RUN_DIR/rollouts/step-N.jsonl (on/off)",
                              parse=parse_switch)
    decode: DecodeSpec = group(DecodeSpec)  # --engine, --spec, --k, --max-k, --compile, --vllm-python

    def __post_init__(self) -> None:
        self.validate()  # a config that exists is a valid one (flags, --config files and the API alike)

    def validate(self) -> None:
        if self.mode not in MODES:
            raise BebopError(f"unknown --mode {self.mode!r}; choose from {', '.join(MODES)}")
        if self.mtp_update not in MTP_UPDATES:
            raise BebopError(f"unknown --mtp-update {self.mtp_update!r}; choose from {', '.join(MTP_UPDATES)}")
        if self.group_size < 2:
            raise BebopError(f"--group-size must be >= 2 (GRPO normalises rewards within a group), got {self.group_size}")
        if self.reward and not (self.data or self.eval_data):
            raise BebopError("--reward scores rows of --data or --eval-data; the generated tasks score themselves")
        check_train_dtype(self.dtype)
        for flag, value in (("--rollout-dtype", self.rollout_dtype), ("--state-dtype", self.state_dtype)):
            if value not in DTYPES:
                raise BebopError(f"unknown {flag} {value!r}; choose from {', '.join(DTYPES)}")
        parse_template_kwargs(self.chat_template_kwargs)
        for name in ("steps", "eval_every", "batch_prompts", "max_new_tokens", "save_every", "batch_size", "ppo_epochs",
                     "mini_batches"):
            if getattr(self, name) < 1:
                raise BebopError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if not self.temperature > 0:
            raise BebopError(f"--temperature must be > 0 for RL (log-probs of a greedy sampler are degenerate), "
                             f"got {self.temperature}")
        if not (self.lr > 0 and self.mtp_lr > 0 and 0 < self.clip_eps < 1 and self.is_cap >= 1 and self.kl_coef >= 0):
            raise BebopError("need --lr > 0, --mtp-lr > 0, 0 < --clip-eps < 1, is_cap >= 1 and --kl-coef >= 0")
        self._check_clip_and_entropy()
        if self.decode.vllm_sleep and self.mode != "sync":
            raise BebopError("--vllm-sleep frees vLLM's memory while the trainer updates: it needs --mode sync (in "
                             "async mode vLLM samples the next batch during the update)")
        if self.rollout_threads < 0 or self.train_threads < 0:
            raise BebopError("--rollout-threads and --train-threads must be >= 0 (0 = torch's default)")
        if self.micro_batch_size < 0:
            raise BebopError(f"--micro-batch-size must be >= 0 (0 = the whole step at once), got {self.micro_batch_size}")
        if self.max_staleness < 0:
            raise BebopError(f"--max-staleness must be >= 0, got {self.max_staleness}")
        if self.mini_batches > self.batch_prompts * self.group_size:
            raise BebopError(f"--mini-batches {self.mini_batches} is more than the {self.batch_prompts * self.group_size} "
                             f"rollouts of a batch (--batch-prompts x --group-size)")
        self.sampling  # noqa: B018 -- SamplingParams checks --top-k and --top-p
        get_task(self.task, self.difficulty)  # unknown task or difficulty -> BebopError

    def _check_clip_and_entropy(self) -> None:
        if not self.clip_eps_high >= 0:
            raise BebopError(f"--clip-eps-high must be >= 0 (0 = the same as --clip-eps), got {self.clip_eps_high}")
        if not self.entropy_coef >= 0:
            raise BebopError(f"--entropy-coef must be >= 0 (a bonus that raises the policy's entropy; 0 = off), "
                             f"got {self.entropy_coef}")

    @property
    def prompts_name(self) -> str:
        """What the run's prompts come from: the --data file's name, else the task's."""
        return Path(self.data).name if self.data else self.task

    def vllm_server(self) -> dict:
        """With --engine vllm: the keyword arguments of the vLLM server a rollout source samples on
        (bebop.vllm.serve.VllmServer, after the model and its source directory)."""
        return {"dtype": self.rollout_dtype, "state_dtype": self.state_dtype, "spec": self.decode.spec,
                "k": self.draft_depths, "seed": self.seed, **self.decode.vllm_worker()}

    @property
    def draft_depths(self) -> int:
        """The deepest draft a step may verify (K, or --max-k with --k auto): also the online MTP depths."""
        return self.decode.draft_depths

    @property
    def sampling(self) -> SamplingParams:
        """The rollout engine's warping; the trainer computes its log-probs under the same one."""
        return SamplingParams(self.temperature, self.top_k, self.top_p)

    @property
    def needs_head(self) -> bool:
        return self.decode.needs_head or self.mtp_update != "none"


def run_identity(config: dict) -> dict:
    """A config's fields that a resume must match: all but those that change only how fast the run goes."""
    speed_only = {f.name for f, _ in leaf_fields(RLConfig) if not f.metadata.get("identity", True)}
    return {k: v for k, v in config.items() if k not in speed_only}


@dataclass(frozen=True)
class Backend:
    """Where rollouts run: in this process (local) or on Ray actors (ray_backend.RaySource).
    `validate` checks the combination only (no I/O); ray_connect.preflight probes the cluster.

    Not saved in config.json: the prompt stream is a pure function of (seed, data index), so a run
    may be resumed on another backend or with another number of workers."""

    name: str = "local"
    rollout_workers: int = 1
    ray_address: str | None = None

    def validate(self, cfg: RLConfig) -> None:
        if self.name not in BACKENDS:
            raise BebopError(f"unknown --backend {self.name!r}; choose from {', '.join(BACKENDS)}")
        if self.name == "local":
            if self.rollout_workers != 1 or self.ray_address is not None:
                raise BebopError("--rollout-workers and --ray-address need --backend ray")
            return
        if cfg.mode != "async":
            raise BebopError("--backend ray samples asynchronously: use --mode async "
                             "(--max-staleness 0 for on-policy batches)")
        check_worker_count(self.rollout_workers, cfg.max_staleness)


def check_worker_count(workers: int, max_staleness: int) -> None:
    """At most max_staleness + 1 rollout workers can sample batches fresh enough to train on."""
    if not 1 <= workers <= max_staleness + 1:
        raise BebopError(f"--rollout-workers {workers} with --max-staleness {max_staleness}: between 1 and "
                         f"max_staleness + 1 = {max_staleness + 1} workers can sample batches fresh enough to "
                         f"train on; raise --max-staleness or use fewer workers")


def check_learner_ranks(cfg: RLConfig, nproc: int) -> None:
    """What an update over `nproc` learner ranks needs: every mini-batch split into equal shares, and the parts
    that run only in one process (the online head update, the vLLM worker) left out."""
    if nproc <= 1:
        return
    rows = cfg.batch_prompts * cfg.group_size
    if rows % (cfg.mini_batches * nproc):
        raise BebopError(f"the batch's {rows} rollouts (--batch-prompts x --group-size) must split into --mini-batches "
                         f"{cfg.mini_batches} x {nproc} ranks equal shares: choose sizes that divide")
    if cfg.mtp_update != "none":
        raise BebopError(f"--mtp-update {cfg.mtp_update} trains the head in the learner's one process: with --nproc "
                         f"{nproc} use --mtp-update none (the pre-RL head drafts)")
    if cfg.decode.engine != "bebop":
        raise BebopError(f"--engine {cfg.decode.engine} with --nproc {nproc} is not supported yet: the learner ranks sample "
                         "with bebop's engine (--engine bebop)")
