"""Pre-RL training of the MTP draft head (docs/method.md section 4).

    bebop mtp train --model DIR --loss e2e_tv [--depths 5] [--steps 300] [--out DIR2] [--resume]

The trunk is frozen and detached: only `mtp.*` parameters train (the embedding and LM head the
head shares with the trunk stay frozen too). Each step takes a batch of sequences, runs the
trunk once without gradients, and trains the teacher-forced chain (bebop.mtp.chain) over
`depths` depths against the trunk's own distributions at the training temperature: the target
for depth d at chain t is the trunk's distribution at position t+d. Chains are kept only where
they lie wholly inside a completion's policy tokens (never in the prompt, padding or an
environment observation). Metrics go to `mtp_metrics.jsonl`; `mtp_train_state.pt` resumes.
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from bebop.errors import BebopError
from bebop.fields import opt
from bebop.losses import DRAFT_LOSSES, DraftLossInputs, draft_loss
from bebop.metrics_log import MetricsLog, require_tensorboard
from bebop.model.checkpoint import save_model
from bebop.model.mtp import MTP_PREFIX
from bebop.mtp.chain import chain_forward, shifted
from bebop.mtp.data import Sequence, demonstration_data, selfdistill_data
from bebop.policy import Policy, load_policy
from bebop.tasks import get_task
from bebop.tokenizer import copy_tokenizer_files
from bebop.train_state import (
    check_same_config,
    load_train_state,
    master_weights,
    restore_master_weights,
    rng_state,
    save_train_state,
    set_rng_state,
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
    task: str = opt("math", "task whose train prompts feed self-distillation")
    num_samples: int = opt(512, "self-distillation samples from the policy")
    num_demos: int = opt(0, "task demonstrations mixed in")
    max_new_tokens: int = opt(192, "per self-distillation sample")
    grad_clip: float = opt(1.0, "gradient-norm clip")
    save_every: int = opt(100, "steps between resumable saves")
    ce_warmup_steps: int = opt(0, "train with ce for the first N steps, then with --loss (the TV gradient "
                                  "vanishes where the draft gives ~0 mass)")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.loss not in DRAFT_LOSSES:
            raise BebopError(f"unknown loss {self.loss!r}; choose from {', '.join(DRAFT_LOSSES)}")
        if self.depths < 1:
            raise BebopError(f"--depths must be >= 1, got {self.depths}")
        if self.steps < 1 or self.batch_size < 1 or self.num_samples + self.num_demos < 1:
            raise BebopError("--steps, --batch-size and the number of sequences must be >= 1")
        if not 0 <= self.ce_warmup_steps < self.steps:
            raise BebopError(f"--ce-warmup-steps must be in [0, steps), got {self.ce_warmup_steps}")
        if not self.temperature > 0:
            raise BebopError(f"--temperature must be > 0 for training targets, got {self.temperature}")


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


def chain_distributions(policy: Policy, batch: ChainBatch, depths: int, temperature: float) -> DraftLossInputs:
    """Every chain of the batch at depths 1..D: the head's logits (gradient into the head only) and the
    trunk's distributions at the same positions (detached), at `temperature` -> (N, D, V) each, keep (N,)."""
    model = policy.model
    head = model.require_mtp()
    with torch.no_grad():
        hidden = model(batch.ids)  # (B, T, H) after the final norm
        target = torch.softmax(model.logits(hidden) / temperature, dim=-1)  # (B, T, V)
        targets = torch.stack([shifted(target, d, 0) for d in range(1, depths + 1)], dim=2)  # (B, T, D, V)
        embeds = [model.embed(shifted(batch.ids, d, policy.pad_id)) for d in range(1, depths + 1)]
    outs = chain_forward(head, hidden, embeds)  # D x (B, T, H)
    draft_logits = torch.stack([model.mtp_logits(o) for o in outs], dim=2) / temperature  # (B, T, D, V)
    v = draft_logits.shape[-1]
    return DraftLossInputs(draft_logits.reshape(-1, depths, v), targets.reshape(-1, depths, v), batch.keep.reshape(-1))


def chain_step(policy: Policy, batch: ChainBatch, cfg: MTPTrainConfig, loss: str | None = None):
    """The draft loss (default cfg.loss) of one batch, gradient into the head only -> DraftLossOutput."""
    inputs = chain_distributions(policy, batch, cfg.depths, cfg.temperature)
    v = inputs.draft_logits.shape[-1]
    return draft_loss(loss or cfg.loss, inputs, chunk_size=max(1, LOSS_CHUNK_FLOATS // (cfg.depths * v)))


def freeze_trunk(policy: Policy) -> list[torch.nn.Parameter]:
    """Only mtp.* trains; returns those parameters."""
    model = policy.model
    model.requires_grad_(False)
    params = model.head_parameters()
    for p in params:
        p.requires_grad_(True)
    return params


def load_data(policy: Policy, cfg: MTPTrainConfig, cache_dir: Path, progress: bool) -> list[Sequence]:
    task = get_task(cfg.task)
    data = []
    if cfg.num_samples:
        data += selfdistill_data(policy, task, n=cfg.num_samples, temperature=cfg.temperature, seed=cfg.seed,
                                 cache_dir=cache_dir, max_new_tokens=cfg.max_new_tokens, progress=progress)
    if cfg.num_demos:
        data += demonstration_data(policy, task, n=cfg.num_demos, seed=cfg.seed)
    return data


def train_mtp(model_dir: str | Path, cfg: MTPTrainConfig, *, out: str | Path | None = None, resume: bool = False,
              progress: bool = True, data_cache: str | Path | None = None, tensorboard: bool = False) -> dict:
    """Train the head of the model in `model_dir`; write it to `out` (default: model_dir).
    Per-step metrics: OUT/mtp_metrics.jsonl (and OUT/tb with `tensorboard`)."""
    if tensorboard:
        require_tensorboard()  # before anything is written
    out = Path(out or model_dir)
    source = out if resume else Path(model_dir)
    policy = load_policy(source, device="cpu")
    policy.model.require_mtp()
    state = load_train_state(out, STATE_FILE) if resume else None
    if state is not None:
        check_same_config(state["config"], asdict(cfg), out)
    params = freeze_trunk(policy)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.95))
    data = load_data(policy, cfg, Path(data_cache or Path(model_dir) / "mtp_data"), progress)
    rng, start = random.Random(cfg.seed), 0
    if state is not None:
        if "head" in state:  # exact, also where the model directory holds the head rounded to its dtype
            restore_master_weights(policy.model, state["head"])
        opt.load_state_dict(state["optimizer"])
        rng.setstate(state["data_rng"])
        set_rng_state(state["rng"])
        start = state["step"]
    elif out != Path(model_dir):
        save_model(policy.model, out)
        copy_tokenizer_files(model_dir, out)
    log = MetricsLog(out, METRICS_FILE, resume_step=start, tensorboard=tensorboard, tag="mtp")
    policy.model.train()
    bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, desc=f"mtp {cfg.loss}",
               disable=not progress, file=sys.stderr)
    t0 = time.perf_counter()
    for step in bar:
        batch = make_batch([data[rng.randrange(len(data))] for _ in range(cfg.batch_size)], cfg.depths, policy.pad_id)
        for g in opt.param_groups:
            g["lr"] = cfg.lr * min(1.0, (step + 1) / 20)
        result = chain_step(policy, batch, cfg, loss_at(step, cfg))
        opt.zero_grad(set_to_none=True)
        result.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        acc = [round(a, 4) for a in result.acceptance_per_depth.tolist()]
        log.write({"step": step + 1, "loss": round(result.loss.item(), 5), "acceptance_per_depth": acc,
                   "num_chains": result.num_chains})
        bar.set_postfix(loss=f"{result.loss.item():.3f}", acc1=f"{acc[0]:.3f}")
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            policy.model.eval()
            save_model(policy.model, out)
            save_train_state(out, {"config": asdict(cfg), "step": step + 1, "optimizer": opt.state_dict(),
                                   "data_rng": rng.getstate(), "rng": rng_state(),
                                   "head": master_weights(policy.model, MTP_PREFIX)}, STATE_FILE)
            policy.model.train()
    log.close()
    last = log.last
    return {"steps": cfg.steps, "loss": last.get("loss"), "acceptance_per_depth": last.get("acceptance_per_depth"),
            "train_seconds_this_run": round(time.perf_counter() - t0, 1), "out": str(out)}

