"""Supervised training of a policy: the embedded default from scratch on a task's demonstrations, or
any model directory (`--model DIR`, e.g. a Hugging Face Qwen3) on your own rows (`--data FILE`).

    bebop sft --task math --out runs/policy-math [--steps 500] [--batch-size 32]
    bebop sft --data sft.jsonl --model path/to/Qwen3 --out runs/sft --lr 1e-5 [--dtype bfloat16]

Every step draws fresh problems from the train split and a fresh demonstration for each (the
demonstrations vary in order and phrasing, so the policy learns a distribution, not a script).
The loss is next-token cross-entropy on the completion only: prompt tokens, padding and
environment observations (`<obs> ... </obs>`, the agent task) are masked out. A step's batch is
sorted by length and run `micro_batch_size` sequences at a time (gradients accumulated: the same
gradient as one padded batch), so the tasks' few long-tail examples do not pad the rest.
Rows of a --data file are (prompt, completion) pairs (bebop.tasks.data_files); chat prompts and
completions are rendered with the model's chat template. Everything is checked before OUT is written.
Progress bar; the model directory is saved every `save_every` steps with a resumable
`train_state.pt` (`--resume`; float32 masters kept where the model's dtype rounds them), and
`sft_meta.json` marks a finished run.
"""

from __future__ import annotations

import json
import math
import random
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from bebop.chat import TEMPLATE_KWARGS_HELP, parse_template_kwargs
from bebop.distributed.learner import Learner, join_world
from bebop.distributed.parallel import Logits, Parallel
from bebop.distributed.world import World
from bebop.embedded import init_model_dir
from bebop.encoding import IGNORE, encode_example
from bebop.errors import BebopError
from bebop.fields import opt
from bebop.fileio import atomic_write_json
from bebop.loggers import LoggerNames
from bebop.model.checkpoint import release_dtype, save_model
from bebop.policy import Policy, load_policy
from bebop.precision import TRAIN_DTYPES, check_train_dtype, train_autocast
from bebop.tasks import TASK_LIST, Problem, Task, get_task
from bebop.tasks.dataset_task import COMPLETIONS, DatasetTask, load_dataset_task, run_task
from bebop.tokenizer import TextCodec, copy_tokenizer_files
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

META_FILE = "sft_meta.json"
METRICS_FILE = "sft_metrics.jsonl"
# steps per task so that the test pass rate at temperature 1 lands in 20-70% (docs/results/policies.md;
# math measured on the 12-layer default, code and agent on the earlier 4-layer one)
DEFAULT_STEPS = {"math": 600, "code": 450, "agent": 500, "mix": 650}


@dataclass(frozen=True)
class SFTConfig:
    task: str = opt("math", f"{TASK_LIST} (or --data FILE)")
    data: str = opt("", "your own (prompt, completion) rows: JSONL or parquet, TRL's or verl's layout")
    model: str = opt("", "start from this model directory (a Hugging Face Qwen3, say) instead of a fresh "
                     "embedded default")
    dtype: str = opt("float32", "training precision: float32, or bfloat16 mixed precision (float32 weights "
                     "and AdamW state)", choices=TRAIN_DTYPES)
    chat_template_kwargs: str = opt("", TEMPLATE_KWARGS_HELP)
    steps: int = opt(600, "optimizer steps (default: per task, " + ", ".join(f"{t} {n}" for t, n in DEFAULT_STEPS.items())
                     + "; 600 otherwise)")
    batch_size: int = opt(32, "sequences per step")
    lr: float = opt(3e-3, "peak learning rate (linear warm-up, cosine decay)")
    warmup: int = opt(30, "warm-up steps")
    weight_decay: float = opt(0.01, "AdamW weight decay")
    seed: int = opt(0, "seeds the model initialisation and the data order")
    difficulty: int = opt(1, "task difficulty 1 (easiest) .. 3")
    pool: int = opt(20000, "train problems drawn once; demonstrations are redrawn every step")
    save_every: int = opt(100, "steps between resumable saves")
    eval_data: str = opt("", "held-out (prompt, completion) rows (JSONL or parquet, as --data): their mean token "
                         "loss, eval_loss, every --eval-every steps and after the last")
    eval_every: int = opt(100, "steps between evaluations on --eval-data")
    micro_batch_size: int = opt(4, "sequences per forward and backward (gradients accumulated: the same step); "
                                "each holds (rows, T, V) logits, so lower it for a real vocabulary")
    model_overrides: tuple = ()  # (("hidden_size", 64), ...) for tiny test models (no flag)

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "pool", "save_every", "micro_batch_size", "eval_every"):
            if getattr(self, name) < 1:
                raise BebopError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if not (self.lr > 0 and self.warmup >= 0 and self.weight_decay >= 0):
            raise BebopError("need --lr > 0, --warmup >= 0 and --weight-decay >= 0")
        get_task(self.task, self.difficulty)  # unknown task or difficulty -> BebopError
        check_train_dtype(self.dtype)
        parse_template_kwargs(self.chat_template_kwargs)
        if self.model and self.model_overrides:
            raise BebopError("model_overrides shape a fresh embedded default; they cannot apply to --model")


def collate(examples: Sequence[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> ids (B, T) right-padded, labels (B, T) aligned so labels[:, t] is the target at t."""
    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    for b, (x, y) in enumerate(examples):
        ids[b, : len(x)] = torch.tensor(x)
        labels[b, : len(y)] = torch.tensor(y)
    return ids, labels


def token_loss_sum(policy: Policy, ids: torch.Tensor, labels: torch.Tensor, dtype: str = "float32",
                   forward: torch.nn.Module | None = None) -> torch.Tensor:
    """Summed cross-entropy of predicting labels[:, t+1] from ids[:, :t+1] (IGNORE labels skipped); the
    forward (`forward`, the learner's wrapped Logits; default the model's own) in the training precision
    `dtype`, the cross-entropy on model.logits' float32."""
    model = policy.model
    forward = forward or Logits(model)
    with train_autocast(model.device, dtype):
        logits = forward(ids.to(model.device))  # (B, T, V) float32
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten().to(model.device),
                           ignore_index=IGNORE, reduction="sum")


def backward_step_loss(policy: Policy, chunks: Sequence[tuple[torch.Tensor, torch.Tensor]],
                       dtype: str = "float32", par: Parallel | None = None) -> float:
    """Backpropagate the step's mean next-token cross-entropy over every trained token of all chunks
    (the gradient of one padded batch, without its padding); return that mean. With `par` the chunks are
    this rank's share: the mean is over every rank's tokens, and the gradients are reduced after the last."""
    local = sum(int((labels[:, 1:] != IGNORE).sum()) for _, labels in chunks)
    n_tokens = max(1, int(par.world.sum([local])[0]) if par else local)
    total = 0.0
    for _, (ids, labels) in par.chunks(chunks) if par else enumerate(chunks):
        loss = token_loss_sum(policy, ids, labels, dtype, par.forward if par else None) / n_tokens
        (loss * (par.loss_scale if par else 1.0)).backward()
        total += loss.item()
    return par.world.sum([total])[0] if par else total


def sample_batch(task: Task, pool: Sequence[Problem], rng: random.Random, codec: TextCodec, batch_size: int,
                 pad_id: int, context: int | None = None, micro: int = 4,
                 world: World = World()) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A step's examples, sorted by length and collated `micro` at a time: [(ids, labels) (b, T_i)]; with
    several ranks, this rank's share (every rank draws the whole batch from the same `rng`).

    Long-tail demonstrations are few; sorting keeps them from padding every short example to their
    length (one padded batch of 32 math examples is ~2.4x its real tokens)."""
    problems = [pool[rng.randrange(len(pool))] for _ in range(batch_size)]
    return collate_by_length([encode_example(codec, p.prompt, task.demonstration(p, rng), context) for p in problems],
                             pad_id, micro, world)


def collate_by_length(examples: list[tuple[list[int], list[int]]], pad_id: int,
                      micro: int, world: World = World()) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Examples sorted by length (this rank's interleaved share of them) and collated `micro` at a time:
    [(ids, labels) (b, T_i)]."""
    examples = world.share(sorted(examples, key=lambda example: len(example[0])))
    return [collate(examples[i:i + micro], pad_id) for i in range(0, len(examples), micro)]


def held_out_chunks(task: DatasetTask, policy: Policy, cfg: SFTConfig) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every row of a held-out file once, as (ids, labels) micro-batches."""
    context = policy.model.config.max_position_embeddings
    rng = random.Random(cfg.seed)  # unused by a file's demonstrations (its completions)
    return collate_by_length([encode_example(policy.codec, p.prompt, task.demonstration(p, rng), context)
                              for p in task.problems("test", len(task.rows), cfg.seed)], policy.pad_id,
                             cfg.micro_batch_size)


def held_out_loss(policy: Policy, chunks: Sequence[tuple[torch.Tensor, torch.Tensor]], dtype: str,
                  forward: torch.nn.Module | None = None) -> float:
    """The mean next-token cross-entropy over every trained token of `chunks`, without gradients (every rank
    runs every chunk: the sharded forward is collective)."""
    n_tokens = max(1, sum(int((labels[:, 1:] != IGNORE).sum()) for _, labels in chunks))
    with torch.no_grad():
        return sum(token_loss_sum(policy, ids, labels, dtype, forward).item() for ids, labels in chunks) / n_tokens


def lr_at(step: int, cfg: SFTConfig) -> float:
    """Linear warmup, then cosine decay to 10% of the peak."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


Tasks = tuple[Task, DatasetTask | None]  # (training task, held-out file)


def _start(out: Path, cfg: SFTConfig, resume: bool, device: str,
           world: World = World()) -> tuple[Policy, Tasks, dict | None]:
    """The policy, its tasks and the state to resume (None for a new run). A new run's inputs are all
    checked (model, data rows, chat template, held-out rows) before OUT is written, by rank 0 only."""
    if resume:
        state = load_train_state(out)
        check_same_config(with_defaults(SFTConfig, state["config"]), asdict(cfg), out)
        policy = load_policy(out, device=device, template_kwargs=cfg.chat_template_kwargs)
        if state.get("masters"):  # the model directory holds the weights rounded to its dtype
            restore_master_weights(policy.model, state["masters"])
        return policy, _tasks(policy, cfg), state
    if (out / "config.json").exists():
        raise BebopError(f"{out} already holds a model; pass --resume to continue it or choose another --out")
    with tempfile.TemporaryDirectory() as tmp:  # every rank builds the same start (one seed)
        source = Path(cfg.model) if cfg.model else init_model_dir(tmp, seed=cfg.seed, **dict(cfg.model_overrides))
        policy = load_policy(source, device=device, template_kwargs=cfg.chat_template_kwargs)
        tasks = _tasks(policy, cfg)
        world.barrier()  # every rank has read its inputs: rank 0 writes
        if world.is_main:
            save_model(policy.model, out)
            copy_tokenizer_files(source, out)
    return policy, tasks, None


def _tasks(policy: Policy, cfg: SFTConfig) -> Tasks:
    held_out = load_dataset_task(cfg.eval_data, policy, need=COMPLETIONS) if cfg.eval_data else None
    return run_task(policy, task=cfg.task, difficulty=cfg.difficulty, data=cfg.data, need=COMPLETIONS), held_out


def _learner(policy: Policy, cfg: SFTConfig, world: World, parallel: str) -> Learner:
    """The wrapped training forward (FSDP2 or DDP over the ranks; the model itself for one) and its AdamW, built
    on the wrapped parameters. A head the model carries is frozen: the loss never reaches it."""
    model = policy.model.train()
    for p in model.head_parameters():
        p.requires_grad_(False)
    par = Parallel(world, parallel, model, Logits(model))
    opt = torch.optim.AdamW(par.forward.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    return Learner(par, opt)


def _save(out: Path, learner: Learner, cfg: SFTConfig, step: int, rng: random.Random, history: list[float]) -> None:
    """The model directory, then train_state.pt, written by rank 0 from the gathered state (every rank calls)."""
    state = learner.gathered()
    if state is None:
        return
    full, optimizer = state
    save_model(full, out)
    save_train_state(out, {"config": asdict(cfg), "step": step, "optimizer": optimizer, "data_rng": rng.getstate(),
                           "rng": rng_state(), "history": history, "learner": learner.par.describe(),
                           "masters": master_weights(full) if release_dtype(full) != full.dtype else None})


def train_sft(out: str | Path, cfg: SFTConfig, *, resume: bool = False, progress: bool = True,
              loggers: LoggerNames = (), device: str = "cpu", parallel: str = "fsdp") -> dict:
    """Train (or resume) a policy in `out`; return the final metrics (also in sft_meta.json). Per-step
    metrics: OUT/sft_metrics.jsonl (and the trackers in `loggers`: bebop.loggers). Under torchrun each rank
    trains its share of every batch (`parallel`: fsdp or ddp, bebop.distributed); rank 0 writes."""
    out = Path(out)
    world, device = join_world(device, parallel, loggers, cfg.batch_size)  # before anything is written
    policy, (task, held_out_task), state = _start(out, cfg, resume, device, world)
    held_out = held_out_chunks(held_out_task, policy, cfg) if held_out_task is not None else None
    num_parameters = sum(p.numel() for p in policy.model.parameters())
    learner = _learner(policy, cfg, world, parallel)
    par, optimizer = learner.par, learner.optimizer
    pool = task.problems("train", cfg.pool, cfg.seed)
    rng = random.Random(cfg.seed)
    start, history = 0, []
    if state is not None:
        learner.restore(state["optimizer"])
        rng.setstate(state["data_rng"])
        set_rng_state(state["rng"])
        start, history = state["step"], state["history"]
    log = learner.metrics_log(out, METRICS_FILE, start=start, loggers=loggers, tag="sft", config=asdict(cfg))
    bar = learner.progress(start, cfg.steps, desc=f"sft {task.name}", enabled=progress)
    t0 = time.perf_counter()
    for step in range(start, cfg.steps):
        chunks = sample_batch(task, pool, rng, policy.codec, cfg.batch_size, policy.pad_id,
                              policy.model.config.max_position_embeddings, cfg.micro_batch_size, world)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        optimizer.zero_grad(set_to_none=True)
        loss = backward_step_loss(policy, chunks, cfg.dtype, par)
        par.clip_grad_norm(list(par.forward.parameters()), 1.0)
        optimizer.step()
        learner.stepped()
        history.append(round(loss, 4))
        record = {"step": step + 1, "loss": history[-1], "lr": lr_at(step, cfg)}
        if held_out is not None and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps):
            record["eval_loss"] = round(held_out_loss(policy, held_out, cfg.dtype, par.forward), 4)
        log.write(record)
        bar.set_postfix(loss=f"{history[-1]:.3f}")
        bar.update()
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            _save(out, learner, cfg, step + 1, rng, history)
    bar.close()
    log.close()
    metrics = {"config": asdict(cfg), "final_loss": sum(history[-20:]) / max(1, len(history[-20:])),
               "steps": cfg.steps, "train_seconds_this_run": round(time.perf_counter() - t0, 1),
               "num_parameters": num_parameters, **learner.summary()}  # the learner, each rank's memory
    if world.is_main:
        atomic_write_json(out / META_FILE, metrics)
    return metrics


def is_trained(model_dir: str | Path) -> bool:
    return (Path(model_dir) / META_FILE).is_file()


def read_meta(model_dir: str | Path) -> dict:
    return json.loads((Path(model_dir) / META_FILE).read_text())
