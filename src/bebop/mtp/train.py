"""Pre-RL training of the MTP draft head (docs/method.md section 4).

    bebop mtp train --model DIR --loss e2e_tv [--depths 5] [--steps 300] [--out DIR2] [--resume]
                    [--dtype float32|bfloat16] [--device auto|cpu|cuda[:N]]

The trunk is frozen and detached: only `mtp.*` parameters train (the embedding and LM head the
head shares with the trunk stay frozen too). Each step takes a batch of sequences, runs the
trunk once without gradients, and trains the teacher-forced chain (bebop.mtp.chain) over
`depths` depths against the trunk's own distributions at the training temperature: the target
for depth d at chain t is the trunk's distribution at position t+d. Chains are kept only where
they lie wholly inside a completion's policy tokens (never in the prompt, padding or an
environment observation). Metrics go to `mtp_metrics.jsonl`; `mtp_train_state.pt` resumes.

Memory: the loss is taken from hidden states (bebop.losses.hidden): the trunk's forward gives
(B, T, H), the head's chain (B, T, D, H), and the LM head's logits and the targets are recomputed
a chunk of chains at a time, so no (B, T, V) or (B, T, D, V) tensor exists at any vocabulary size
(docs/benchmarks.md). `--dtype bfloat16` runs the trunk, the head and the LM-head products
under bf16 autocast (bebop.precision); the head's weights, its AdamW state and the loss's softmax
and values stay float32, and the saved model keeps its declared dtype.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from bebop.chat import parse_template_kwargs
from bebop.decoding import DecodeSpec, open_engine
from bebop.distributed.parallel import Parallel, check_parallel
from bebop.distributed.world import World, init_world, peak_memory_mb
from bebop.encoding import env_token_mask
from bebop.engine.names import ROLLOUT_ENGINES
from bebop.errors import BebopError
from bebop.fields import opt
from bebop.loggers import LoggerNames, check_loggers
from bebop.losses import DRAFT_LOSSES, DraftHiddenInputs, DraftLossInputs, DraftLossOutput, draft_loss_from_hidden
from bebop.metrics_log import NO_LOG, MetricsLog
from bebop.model.checkpoint import save_model
from bebop.model.mtp import MTP_PREFIX
from bebop.model.qwen3 import CausalLM
from bebop.mtp.chain import chain_forward, shifted
from bebop.mtp.data import SAMPLE_BATCH, Sequence, demonstration_data, selfdistill_data
from bebop.mtp.patience import Patience
from bebop.mtp.rollout_files import read_rollouts
from bebop.policy import Policy, load_policy, resolve_device
from bebop.precision import TRAIN_DTYPES, check_train_dtype, train_autocast
from bebop.progress import bar as progress_bar
from bebop.sampling import SamplingParams
from bebop.tasks import TASK_LIST
from bebop.tasks.dataset_task import COMPLETIONS, PROMPTS, run_task
from bebop.tokenizer import copy_tokenizer_files
from bebop.train_state import (
    check_same_config,
    load_train_state,
    master_weights,
    restore_master_weights,
    rng_state,
    save_train_state,
    set_rng_state,
    with_defaults,
)

STATE_FILE = "mtp_train_state.pt"
LOSS_CHUNK_FLOATS = 1 << 22  # loss temporaries per chunk: ~16 MB of float32 (5 chains at K=5, V=151k)
METRICS_FILE = "mtp_metrics.jsonl"


@dataclass(frozen=True)
class MTPTrainConfig:
    loss: str = opt("e2e_tv", "the draft loss", choices=tuple(DRAFT_LOSSES))
    depths: int = opt(5, "chain depths trained (the paper: 5, drafting K = 3)")
    steps: int = opt(300, "optimizer steps")
    lr: float = opt(2e-3, "head learning rate (AdamW)")
    batch_size: int = opt(16, "sequences per step")
    temperature: float = opt(1.0, "sampling and target temperature")
    seed: int = opt(0, "seeds the data and the order")
    task: str = opt("math", f"task whose train prompts feed self-distillation: {TASK_LIST} (or --data FILE)")
    data: str = opt("", "your own prompts for self-distillation: a JSONL or parquet file (verl or TRL rows)")
    chat_template_kwargs: str = opt("", "extra chat-template variables, a JSON object: '{\"enable_thinking\": false}' "
                                    "turns Qwen3's thinking off")
    rollouts: str = opt("", "train on these token ids instead of self-distillation samples: any engine's or RL "
                        "framework's rollouts (the formats `bebop mtp diagnose` reads), used as given; targets are "
                        "still the trunk's own distributions")
    num_samples: int = opt(512, "self-distillation samples from the policy")
    num_demos: int = opt(0, "task demonstrations mixed in")
    max_new_tokens: int = opt(192, "per self-distillation sample")
    grad_clip: float = opt(1.0, "gradient-norm clip")
    save_every: int = opt(100, "steps between resumable saves")
    dtype: str = opt("float32", "training precision: float32, or bfloat16 mixed precision (autocast; the head's "
                     "weights and AdamW state stay float32, the loss's softmax and values float32)",
                     choices=TRAIN_DTYPES)
    ce_warmup_steps: int = opt(0, "train with ce for the first N steps, then with --loss (the TV gradient "
                                  "vanishes where the draft gives ~0 mass)")
    held_out: int = opt(0, "self-distillation samples kept out of training, to measure the head's expected "
                        "acceptance on (bebop.mtp.heldout; 0: none)")
    eval_every: int = opt(0, "steps between held-out measures, logged as heldout_rs_acceptance (needs --held-out)")
    patience: int = opt(0, "stop after this many held-out measures without an improvement and keep the best head "
                        "(0: train every --steps; the best measured head is still the one saved)")
    eval_k: int = opt(3, "drafts per step of the held-out measure (RS expected acceptance rate at this K)")
    engine: str = opt("bebop", "the engine that samples self-distillation: bebop's, or vLLM in a worker process "
                      "(docs/vllm.md; --vllm-python or BEBOP_VLLM_PYTHON)", choices=ROLLOUT_ENGINES)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.loss not in DRAFT_LOSSES:
            raise BebopError(f"unknown loss {self.loss!r}; choose from {', '.join(DRAFT_LOSSES)}")
        if self.depths < 1:
            raise BebopError(f"--depths must be >= 1, got {self.depths}")
        if self.steps < 1 or self.batch_size < 1 or (self.num_samples + self.num_demos < 1 and not self.rollouts):
            raise BebopError("--steps, --batch-size and the number of sequences must be >= 1")
        if not 0 <= self.ce_warmup_steps < self.steps:
            raise BebopError(f"--ce-warmup-steps must be in [0, steps), got {self.ce_warmup_steps}")
        if not self.temperature > 0:
            raise BebopError(f"--temperature must be > 0 for training targets, got {self.temperature}")
        check_train_dtype(self.dtype)
        self._check_held_out()
        parse_template_kwargs(self.chat_template_kwargs)
        DecodeSpec(engine=self.engine, compile="off")  # an unknown engine -> BebopError


    def _check_held_out(self) -> None:
        if min(self.held_out, self.eval_every, self.patience) < 0 or self.eval_k < 1:
            raise BebopError("--held-out, --eval-every and --patience must be >= 0 and --eval-k >= 1")
        if self.held_out and (self.rollouts or self.held_out >= self.num_samples):
            raise BebopError(f"--held-out {self.held_out} keeps self-distillation samples out of training: it needs "
                             f"fewer than --num-samples ({self.num_samples}) and no --rollouts")
        if bool(self.eval_every) != bool(self.held_out):
            raise BebopError("--eval-every and --held-out go together: the held-out samples are what is measured")
        if self.patience and not self.eval_every:
            raise BebopError("--patience counts held-out measures: give --eval-every and --held-out")


@dataclass
class ChainBatch:
    ids: torch.Tensor  # (B, T) right-padded sequences
    keep: torch.Tensor  # (B, T) bool: chain starts that are trained


def make_batch(seqs: list[Sequence], depths: int, pad_id: int) -> ChainBatch:
    """Pad sequences; keep chain t iff positions t+1..t+depths are policy completion tokens."""
    width = max(len(s.ids) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    trainable = torch.zeros(len(seqs), width + depths, dtype=torch.bool)  # position is a policy token
    for b, s in enumerate(seqs):
        ids[b, : len(s.ids)] = torch.tensor(s.ids)
        p = len(s.prompt_ids)
        trainable[b, p: p + len(s.completion_ids)] = ~torch.tensor(s.env_mask, dtype=torch.bool)
    keep = torch.ones(len(seqs), width, dtype=torch.bool)
    for d in range(1, depths + 1):
        keep &= trainable[:, d: d + width]
    return ChainBatch(ids, keep)


def loss_at(step: int, cfg: MTPTrainConfig) -> str:
    """The draft loss used at `step` (0-based): ce during the warm-up, then cfg.loss."""
    return "ce" if step < cfg.ce_warmup_steps else cfg.loss


class DraftChains(torch.nn.Module):
    """The training forward of the head as one module (what DDP and FSDP2 wrap): ids (B, T) -> the head's chain
    outputs (gradient into the head only) and the trunk's states at the target positions (detached), (B, T, D, H)
    each after their norms, and the shared LM head's weight (V, H). The target for depth d at chain t is the
    trunk's state (hence distribution) at position t+d."""

    def __init__(self, model: CausalLM, depths: int, pad_id: int) -> None:
        super().__init__()
        self.model, self.depths, self.pad_id = model, depths, pad_id

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        model, depths = self.model, self.depths
        with torch.no_grad():
            hidden = model(ids)  # (B, T, H) after the final norm
            targets = torch.stack([shifted(hidden, d, 0) for d in range(1, depths + 1)], dim=2)  # (B, T, D, H)
            embeds = [model.embed(shifted(ids, d, self.pad_id)) for d in range(1, depths + 1)]
        drafts = torch.stack(chain_forward(model.require_mtp(), hidden, embeds), dim=2)  # (B, T, D, H)
        return drafts, targets, model.lm_head.weight


def chain_hidden(policy: Policy, batch: ChainBatch, depths: int, temperature: float,
                 forward: torch.nn.Module | None = None) -> DraftHiddenInputs:
    """Every chain of the batch at depths 1..D as hidden states (DraftChains; `forward`: the learner's wrapped
    one) -> (N, D, H) each, with the shared LM head and keep (N,)."""
    model = policy.model
    forward = forward or DraftChains(model, depths, policy.pad_id)
    drafts, targets, lm_head = forward(batch.ids.to(model.device))
    h = drafts.shape[-1]
    # model.logits and model.mtp_logits are both lm_head(x).float(): a bias-free product, no softcap or scale
    return DraftHiddenInputs(drafts.reshape(-1, depths, h), targets.reshape(-1, depths, h), lm_head,
                             temperature, batch.keep.to(model.device).reshape(-1))


def chain_distributions(policy: Policy, batch: ChainBatch, depths: int, temperature: float) -> DraftLossInputs:
    """`chain_hidden` as full distributions: the head's logits and the trunk's probabilities, (N, D, V) each,
    keep (N,). For small evaluation batches (diagnostics); training goes through `chain_step`, which never
    makes an (N, D, V) tensor."""
    return chain_hidden(policy, batch, depths, temperature).materialise()


def loss_chunk_size(depths: int, vocab_size: int) -> int:
    """Chains per loss chunk: about LOSS_CHUNK_FLOATS floats per (chunk, D, V) temporary."""
    return max(1, LOSS_CHUNK_FLOATS // (depths * vocab_size))


def chain_step(policy: Policy, batch: ChainBatch, cfg: MTPTrainConfig, loss: str | None = None,
               forward: torch.nn.Module | None = None):
    """The draft loss (default cfg.loss) of one batch, gradient into the head only -> DraftLossOutput.

    Fused from the hidden states (bebop.losses.hidden): the LM head's logits are recomputed chunk by
    chunk in forward and backward, never held for the whole batch."""
    inputs = chain_hidden(policy, batch, cfg.depths, cfg.temperature, forward)
    chunk = loss_chunk_size(cfg.depths, inputs.lm_head.shape[0])
    return draft_loss_from_hidden(loss or cfg.loss, inputs, chunk_size=chunk)


def freeze_trunk(policy: Policy) -> list[torch.nn.Parameter]:
    """Only mtp.* trains; returns those parameters."""
    model = policy.model
    model.requires_grad_(False)
    params = model.head_parameters()
    for p in params:
        p.requires_grad_(True)
    return params


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


def _opener(policy: Policy, model_dir: Path, cfg: MTPTrainConfig, python: str | None):
    """What opens the engine that samples self-distillation (bebop's, eager; or a vLLM worker), on a cache miss."""
    spec = DecodeSpec(engine=cfg.engine, compile="off", vllm_python=python or "")
    return lambda: open_engine(policy, spec, model_dir=model_dir, rows=cfg.num_samples, batch_size=SAMPLE_BATCH,
                               max_new_tokens=cfg.max_new_tokens, sampling=SamplingParams(cfg.temperature),
                               seed=cfg.seed)


def saved_config(state: dict) -> dict:
    """A saved state's config (fields added since: their defaults, e.g. dtype float32, data none)."""
    return with_defaults(MTPTrainConfig, state["config"])


def _training_device(name: str) -> str:
    try:
        resolve_device(name)
    except RuntimeError:  # torch's own message lists every backend it knows
        raise BebopError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N") from None
    return name


def _start(model_dir: Path, out: Path, cfg: MTPTrainConfig, resume: bool, device: str) -> tuple[Policy, dict | None]:
    """The policy on `device` (from `out` when resuming) and the state to resume, config checked; a resumed head's
    exact weights restored."""
    policy = load_policy(out if resume else model_dir, device=_training_device(device),
                         template_kwargs=cfg.chat_template_kwargs)
    policy.model.require_mtp()
    state = load_train_state(out, STATE_FILE, map_location="cpu") if resume else None
    if state is not None:
        check_same_config(saved_config(state), asdict(cfg), out)
        if "head" in state:  # exact, also where the model directory holds the head rounded to its dtype
            restore_master_weights(policy.model, state["head"])
    return policy, state


@dataclass
class _Run:
    """What the loop needs: the policy, its wrapped forward over the ranks, the head's optimizer and parameters."""

    policy: Policy
    par: Parallel
    opt: torch.optim.Optimizer
    params: list[torch.nn.Parameter]
    cfg: MTPTrainConfig
    out: Path
    train_peak: float = 0.0  # this rank's peak memory (MB) over the training steps
    state_mb: float = 0.0  # what it holds of weights (trunk included), gradients and AdamW state

    @property
    def world(self) -> World:
        return self.par.world


def _learner(policy: Policy, cfg: MTPTrainConfig, world: World, parallel: str, out: Path) -> _Run:
    """The trunk frozen, the training forward wrapped (FSDP2 shards the frozen trunk too: it is the memory), and
    AdamW over the head's (wrapped) parameters."""
    freeze_trunk(policy)
    par = Parallel(world, parallel, policy.model, DraftChains(policy.model, cfg.depths, policy.pad_id))
    params = policy.model.head_parameters()
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.95))  # float32 state: float32 params
    return _Run(policy, par, opt, params, cfg, out)


def _train_step(run: _Run, batch: ChainBatch, step: int) -> tuple[DraftLossOutput, dict]:
    """One optimizer step on this rank's share: the chain loss forward in the training precision, backward (the
    share's mean weighted by its share of every rank's chains), clip, AdamW -> (output, the step's metrics)."""
    cfg, world = run.cfg, run.world
    for g in run.opt.param_groups:
        g["lr"] = cfg.lr * min(1.0, (step + 1) / 20)
    with train_autocast(run.policy.model.device, cfg.dtype):
        result = chain_step(run.policy, batch, cfg, loss_at(step, cfg), run.par.forward)
    run.opt.zero_grad(set_to_none=True)
    metrics = _step_metrics(result, world)
    share = result.num_chains / max(1, metrics["num_chains"]) if world.distributed else 1.0
    (result.loss * (share * run.par.loss_scale)).backward()
    run.par.clip_grad_norm(run.params, cfg.grad_clip)
    run.opt.step()
    run.train_peak = peak_memory_mb(run.policy.model.device)  # before a save gathers the state on rank 0
    run.state_mb = run.par.state_mb(run.opt)
    return result, metrics


def _step_metrics(result: DraftLossOutput, world: World) -> dict:
    """The step's loss and acceptance per depth over every rank's chains (chain-weighted means)."""
    acc = result.acceptance_per_depth.tolist()
    loss, n = result.loss.item(), result.num_chains
    if world.distributed:
        sums = world.sum([loss * n, *(a * n for a in acc), n])
        n = int(sums[-1])
        loss, acc = sums[0] / max(1, n), [a / max(1, n) for a in sums[1:-1]]
    return {"loss": round(loss, 5), "acceptance_per_depth": [round(a, 4) for a in acc], "num_chains": n}


def _save(run: _Run, step: int, rng: random.Random, watch: Patience, stopped: bool = False) -> None:
    """The model, then the train state, by rank 0 from the gathered weights (every rank calls)."""
    full, optimizer = run.par.full_model(), run.par.optimizer_state(run.opt)
    if full is None:
        return
    full.eval()
    save_model(full, run.out)  # in the model's declared dtype
    save_train_state(run.out, {"config": asdict(run.cfg), "step": step, "optimizer": optimizer,
                               "data_rng": rng.getstate(), "rng": rng_state(), "learner": run.par.describe(),
                               "head": master_weights(full, MTP_PREFIX), "patience": watch.state(),
                               "stopped": stopped}, STATE_FILE)  # stopped: by --patience, before --steps
    full.train()


def split_held_out(data: list[Sequence], cfg: MTPTrainConfig) -> tuple[list[Sequence], list[Sequence]]:
    """(training sequences, held-out ones): the last --held-out self-distillation samples are held out."""
    if not cfg.held_out:
        return data, []
    cut = cfg.num_samples - cfg.held_out  # the samples come first, demonstrations after them
    return data[:cut] + data[cfg.num_samples:], data[cut: cfg.num_samples]


def _held_out_measure(policy: Policy, held: list[Sequence], cfg: MTPTrainConfig) -> float:
    from bebop.mtp.heldout import expected_acceptance

    return expected_acceptance(policy, held, k=cfg.eval_k, temperature=cfg.temperature, seed=cfg.seed)["rs"]["rate"]


def _load_data_ranked(policy: Policy, cfg: MTPTrainConfig, model_dir: Path, data_cache: str | Path | None,
                      progress: bool, vllm_python: str | None, world: World) -> list[Sequence]:
    """The training sequences; with several ranks, rank 0 samples (and caches) them first, then the others read."""
    cache = Path(data_cache or model_dir / "mtp_data")
    opener = _opener(policy, model_dir, cfg, vllm_python)
    data = load_data(policy, cfg, cache, progress, opener) if world.is_main else []
    world.barrier()
    return data if world.is_main else load_data(policy, cfg, cache, False, opener)


def train_mtp(model_dir: str | Path, cfg: MTPTrainConfig, *, out: str | Path | None = None, resume: bool = False,
              progress: bool = True, data_cache: str | Path | None = None, loggers: LoggerNames = (),
              device: str = "auto", vllm_python: str | None = None, parallel: str = "fsdp") -> dict:
    """Train the head of the model in `model_dir` on `device` (auto, cpu, cuda, cuda:N); write it to `out`
    (default: model_dir). Per-step metrics: OUT/mtp_metrics.jsonl (and the trackers in `loggers`: bebop.loggers).
    The device is not part of the run: a run resumes on another one. With --held-out and --eval-every the head
    with the best held-out expected acceptance is the one saved (and --patience stops when it stops improving).
    Under torchrun each rank trains its share of every batch (`parallel`: fsdp or ddp, bebop.distributed); rank 0 writes."""
    check_loggers(loggers)  # before anything is written
    check_parallel(parallel)
    world, device = init_world(device)
    world.check_divides(cfg.batch_size, "--batch-size")
    out = Path(out or model_dir)
    policy, state = _start(Path(model_dir), out, cfg, resume, device)
    if state is not None and state.get("stopped"):  # patience ran out: the run is done
        return _summary(cfg, out, state["step"], Patience.from_state(state["patience"]), None, 0.0)
    data, held = split_held_out(_load_data_ranked(policy, cfg, Path(model_dir), data_cache, progress, vllm_python,
                                                  world), cfg)
    if state is None and out != Path(model_dir) and world.is_main:
        save_model(policy.model, out)
        copy_tokenizer_files(model_dir, out)
    run = _learner(policy, cfg, world, parallel, out)
    rng, start, watch = random.Random(cfg.seed), 0, Patience(cfg.patience)
    if state is not None:
        start, watch = _restore(run, rng, state)
    log = MetricsLog(out, METRICS_FILE, resume_step=start, loggers=loggers, tag="mtp",
                     config=asdict(cfg) | {"learner": run.par.describe()}) if world.is_main else NO_LOG
    t0 = time.perf_counter()
    step = _train_loop(run, data, held, rng, watch, log, start, progress)
    log.close()
    memory = {"peak_memory_mb": [round(m, 1) for m in world.gather(run.train_peak)],
              "state_mb": [round(m, 1) for m in world.gather(run.state_mb)]}  # per rank
    return _summary(cfg, out, step, watch, log.last, time.perf_counter() - t0) | {"learner": run.par.describe(),
                                                                                **memory}


def _restore(run: _Run, rng: random.Random, state: dict) -> tuple[int, Patience]:
    run.par.load_optimizer_state(run.opt, state["optimizer"])  # moves the state onto the parameters' device
    rng.setstate(state["data_rng"])
    set_rng_state(state["rng"])
    watch = Patience.from_state(state["patience"]) if "patience" in state else Patience(0)
    return state["step"], watch


def _measure(run: _Run, held: list[Sequence], watch: Patience, step: int, row: dict) -> bool:
    """The held-out measure (rank 0, on the whole model; every rank learns it) -> True: patience ran out."""
    full = run.par.full_model()
    value = round(_held_out_measure(replace(run.policy, model=full), held, run.cfg), 6) if full is not None else None
    row["heldout_rs_acceptance"] = value = run.world.broadcast(value)
    if step <= run.cfg.ce_warmup_steps:  # a head of --loss: the warm-up's ce heads are neither kept nor counted
        return False
    return watch.update(value, step, full)


def _keep_best(run: _Run, watch: Patience) -> None:
    """The best measured head back in the model on every rank (no-op without a held-out measure)."""
    best = run.world.broadcast(watch.best_head)
    if best is not None:
        run.par.load_full_state(best, strict=False)


def _train_loop(run: _Run, data: list[Sequence], held: list[Sequence], rng: random.Random, watch: Patience,
                log: MetricsLog, start: int, progress: bool) -> int:
    """Steps start+1 .. cfg.steps (or until patience runs out); -> the last step trained. Saves every
    --save-every steps and at the end, the best held-out head in the model when there is a held-out measure."""
    cfg, policy = run.cfg, run.policy
    policy.model.train()
    bar = progress_bar(initial=start, total=cfg.steps, desc=f"mtp {cfg.loss}", unit="step",
                       enabled=progress and run.world.is_main)
    step = start
    for step in range(start + 1, cfg.steps + 1):
        seqs = [data[rng.randrange(len(data))] for _ in range(cfg.batch_size)]
        _, row = _train_step(run, make_batch(run.world.share(seqs), cfg.depths, policy.pad_id), step - 1)
        row = {"step": step, **row}
        stop = bool(cfg.eval_every and step % cfg.eval_every == 0) and _measure(run, held, watch, step, row)
        log.write(row)
        bar.set_postfix(loss=f"{row['loss']:.3f}", acc1=f"{row['acceptance_per_depth'][0]:.3f}")
        bar.update()
        if stop or step == cfg.steps:
            _keep_best(run, watch)
            _save(run, step, rng, watch, stopped=stop)
            break
        if step % cfg.save_every == 0:
            _save(run, step, rng, watch)
    bar.close()
    return step


def _summary(cfg: MTPTrainConfig, out: Path, step: int, watch: Patience, last: dict | None, seconds: float) -> dict:
    last = last or {}
    summary = {"steps": cfg.steps, "steps_trained": step, "loss": last.get("loss"),
               "acceptance_per_depth": last.get("acceptance_per_depth"),
               "train_seconds_this_run": round(seconds, 1), "out": str(out)}
    if cfg.eval_every:
        summary |= {"best_step": watch.best_step, "heldout_rs_acceptance_best": watch.best,
                    "stopped_early": step < cfg.steps}
    return summary
