"""`bebop mtp train`'s settings (MTPTrainConfig: its flags, checked when made) and a saved run's config read back."""

from __future__ import annotations

from dataclasses import dataclass

from bebop.chat import TEMPLATE_KWARGS_HELP, parse_template_kwargs
from bebop.decoding import DecodeSpec
from bebop.errors import BebopError
from bebop.fields import like, opt
from bebop.losses import DRAFT_LOSSES
from bebop.precision import TRAIN_DTYPES, check_train_dtype
from bebop.tasks import TASK_LIST
from bebop.train_state import with_defaults


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
    chat_template_kwargs: str = opt("", TEMPLATE_KWARGS_HELP)
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
    engine: str = like(DecodeSpec, "engine")  # the engine that samples self-distillation

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


def saved_config(state: dict) -> dict:
    """A saved state's config (fields added since: their defaults, e.g. dtype float32, data none)."""
    return with_defaults(MTPTrainConfig, state["config"])
