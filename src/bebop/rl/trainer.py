"""The GRPO policy update: trainer log-probs under the sampler's warping, clipped loss, N epochs x M
mini-batches of optimizer steps per batch (decoupled PPO).

    trainer = PolicyTrainer(policy, cfg)
    stats = trainer.step(batch)        # RolloutBatch -> TrainStats; policy_version += 1

Three policies meet in one update (grpo.py's glossary): the sampler that drew the tokens (maybe
stale, async), the trainer at the start of this update ("old": the PPO ratio's anchor, computed
once under no_grad) and the trainer now. With ppo_epochs = mini_batches = 1 (the default) there is
one optimizer step and the old log-probs are the detached log-probs of that same forward, so the
ratio is 1 and nothing clips; with more, every step after the first moves the weights away from
"old" and the clip bounds how far (as in PPO, and decoupled from the sampler's staleness, which the
truncated importance weight min(pi_old / pi_sampler, cap) corrects, as in AReaL).

Mini-batches split the batch's rows in a random order drawn from (seed, policy version), so a
resumed run reshuffles exactly as the uninterrupted one; advantages are computed over the whole
batch first (groups stay whole for the baseline). Each mini-batch's loss is its token-level mean.

Each optimizer step runs its forward and backward `micro_batch_size` rows at a time (0: all at once),
gradients accumulated with each micro-batch's token mean weighted by its share of the step's tokens:
the same gradient as one padded forward, in memory bounded by the micro-batch (a real vocabulary's
logits need it). Each micro-batch runs packed (TrainBatch.packed, model/packing.py): a group's rows
share a micro-batch, their prompt runs once, and no row is padded (a GRPO batch's prompts are often
half its tokens).

The optimizer holds the trunk only: `mtp.*` parameters are excluded (the head changes only
through an online MTP strategy, with its own optimizer). With kl_coef > 0 a frozen copy of the
starting weights (trunk only) serves as the KL reference; with 0 no copy is kept. With entropy_coef > 0
the update's forwards keep the entropy's graph for the loss's bonus; with 0 it is computed detached, as
for the metrics alone.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from bebop.distributed.learner import Learner
from bebop.distributed.parallel import Logits, Parallel
from bebop.distributed.world import World
from bebop.model.qwen3 import CausalLM
from bebop.policy import Policy
from bebop.precision import train_autocast
from bebop.rl.batch import TrainBatch, to_train_batch
from bebop.rl.config import RLConfig
from bebop.rl.grpo import GRPOLossInputs, GRPOLossOutput, grpo_loss, token_logprobs
from bebop.rl.records import RolloutBatch
from bebop.sampling import SamplingParams


@dataclass
class TrainStats:
    loss: float  # mean over the update's optimizer steps
    pg_loss: float
    kl: float
    clip_frac: float  # share of policy tokens whose ratio was clipped, over all steps of the update
    is_weight_mean: float
    is_truncated_frac: float
    sampler_kl: float  # k3 KL(sampler || trainer) over policy tokens (a bfloat16 sampler's mismatch)
    train_entropy: float  # the trainer's entropy (warped as the sampler's) over policy tokens, before the update
    grad_norm: float  # mean pre-clip gradient norm over the optimizer steps
    optimizer_steps: int


def frozen_reference(model: CausalLM) -> CausalLM:
    """A frozen copy of `model` without its head (the KL reference)."""
    ref = copy.deepcopy(model).eval()
    ref.mtp = None
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def logprobs_of(model: CausalLM, batch: TrainBatch, sampling: SamplingParams, dtype: str = "float32",
                entropy_grad: bool = False, forward: torch.nn.Module | None = None,
                packed: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (log-probs (B, T-1) of ids[:, 1:], entropy (B, T-1)) under the sampler's warping, 0 in the columns
    before each prompt's last token; the forward (`forward`: the learner's wrapped Logits; default the model's
    own) runs in the training precision `dtype` (bebop.precision), the log-softmax on model.logits' float32.
    The entropy carries gradient only with `entropy_grad` (see token_logprobs). `packed`: the rows packed
    (TrainBatch.packed: each distinct prompt once, no padding), else padded."""
    rows = batch.packed() if packed else None
    forward = forward or Logits(model)
    with train_autocast(model.device, dtype):
        if rows is None:
            logits, targets = forward(batch.ids)[:, :-1], batch.ids[:, 1:]  # (B, T-1, V) float32, (B, T-1)
        else:
            logits, targets = forward(rows.packing.ids, rows.packing), rows.targets  # (M, V) float32, (M,)
    picked, entropy = token_logprobs(logits, targets, sampling, entropy_grad)
    if rows is None:
        return picked, entropy
    return rows.unpack(picked), rows.unpack(entropy)


def mini_batch_rows(rows: int, mini_batches: int, generator: torch.Generator) -> list[torch.Tensor]:
    """A random split of range(rows) into `mini_batches` near-equal index tensors."""
    return list(torch.randperm(rows, generator=generator).tensor_split(mini_batches))


def micro_batch_rows(batch: TrainBatch, size: int, by_prompt: bool = False) -> list[torch.Tensor]:
    """The batch's rows in micro-batches of at most `size` (0: all in one), by width: the long tail's few long
    rows share micro-batches, and the short ones are not padded to their length. `by_prompt` (a packed
    update): a prompt's rows together, by width within it, so that a micro-batch runs its prompt once."""
    rows = batch.ids.shape[0]
    if size <= 0 or size >= rows:
        return [torch.arange(rows, device=batch.ids.device)]
    order = torch.argsort(batch.widths, stable=True)  # (B,)
    if by_prompt:
        order = order[torch.argsort(batch.prompts[order], stable=True)]
    return list(order.split(size))


@dataclass
class Update:
    """One optimizer step: the loss terms of each micro-batch, the pre-clip gradient norm, and the summed
    entropy of the forward (over policy tokens)."""

    outs: list[GRPOLossOutput]
    grad_norm: float
    entropy_sum: float


class PolicyTrainer:
    def __init__(self, policy: Policy, cfg: RLConfig, *, reference: CausalLM | None = None,
                 policy_version: int = 0, par: Parallel | None = None, packed: bool = True) -> None:
        """`reference`: the frozen starting policy, required when cfg.kl_coef > 0 (see frozen_reference). `par`:
        the training forward over the ranks (bebop.distributed; built before the trainer: the optimizer holds its
        parameters); default one process. `packed`: pack the micro-batches (False: the padded update, which the
        packed one is tested and measured against)."""
        self.policy, self.cfg = policy, cfg
        self.packed = packed
        self.par = par or Parallel(World(), "fsdp", policy.model, Logits(policy.model))
        self.params = policy.model.trunk_parameters()
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.99))
        self.learner = Learner(self.par, self.optimizer)  # what the run logs, saves and reports of the update
        if cfg.kl_coef > 0 and reference is None:
            raise ValueError("kl_coef > 0 needs a reference model")
        self.reference = reference if cfg.kl_coef > 0 else None
        self.policy_version = policy_version
        self.sampling = cfg.sampling

    def step(self, rollouts: RolloutBatch) -> TrainStats:
        """One update on the batch; with several ranks each takes its share of every mini-batch (equal shares:
        the config's check), the loss normalised by the whole mini-batch's tokens."""
        cfg, model, world = self.cfg, self.policy.model, self.par.world
        batch = to_train_batch(rollouts, self.policy.pad_id).to(model.device)
        model.train()
        if cfg.ppo_epochs == 1 and cfg.mini_batches == 1:  # one step: "old" is this forward, detached
            updates = [self._update(self._share(batch), None, _tokens(batch))]
            entropy_sum = world.sum([updates[0].entropy_sum])[0]
        else:
            old, entropy_sum = self._anchor(batch)  # (B, T-1): the anchor of every step, all rows on every rank
            generator = torch.Generator().manual_seed(cfg.seed * 1_000_003 + self.policy_version)
            splits = [rows.to(model.device) for _ in range(cfg.ppo_epochs)
                      for rows in mini_batch_rows(batch.ids.shape[0], cfg.mini_batches, generator)]
            updates = [self._update(batch.rows(self._mine(rows)), old[self._mine(rows)], _tokens(batch.rows(rows)))
                       for rows in splits]
        self.policy_version += 1
        self.learner.stepped()
        return _summarise(updates, entropy_sum / max(1, int(batch.mask.sum())), world)

    def _share(self, batch: TrainBatch) -> TrainBatch:
        """This rank's rows of the whole batch (the batch itself for one process)."""
        if not self.par.world.distributed:
            return batch
        return batch.rows(self._mine(torch.arange(batch.ids.shape[0], device=batch.ids.device)))

    def _mine(self, rows: torch.Tensor) -> torch.Tensor:
        """This rank's rows of `rows` (interleaved; all of them for one process)."""
        world = self.par.world
        return rows[world.rank:: world.size] if world.distributed else rows

    def _logprobs(self, model: CausalLM, part: TrainBatch, entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        forward = self.par.forward if model is self.policy.model else None  # the reference: its own forward
        return logprobs_of(model, part, self.sampling, self.cfg.dtype, entropy_grad, forward, self.packed)

    def _micro_forwards(self, batch: TrainBatch, entropy_grad: bool = False
                        ) -> Iterator[tuple[torch.Tensor, TrainBatch, torch.Tensor, torch.Tensor]]:
        """Each micro-batch of `batch`: its rows, those rows trimmed, and their log-probs and entropy (b, w)
        (the entropy with gradient when `entropy_grad`: the loss's entropy bonus). Each is yielded inside the
        learner's gradient-sync context (reduced across ranks after the last micro-batch's backward)."""
        for _, rows in self.par.chunks(micro_batch_rows(batch, self.cfg.micro_batch_size, by_prompt=self.packed)):
            part = batch.rows(rows).trimmed()
            yield (rows, part, *self._logprobs(self.policy.model, part, entropy_grad))

    def _anchor(self, batch: TrainBatch) -> tuple[torch.Tensor, float]:
        """The trainer's log-probs before the update (B, T-1), under no_grad, and their summed entropy: each rank
        computes its share of the rows and the ranks gather them (a row's mini-batch may fall to any rank)."""
        world = self.par.world
        mine = self._share(batch)
        old = torch.zeros(mine.mask.shape, device=batch.ids.device)  # (B / ranks, T-1)
        entropy_sum = 0.0
        with torch.no_grad():
            for rows, part, logprobs, entropy in self._micro_forwards(mine):
                old[rows, : logprobs.shape[1]] = logprobs
                entropy_sum += float((entropy * part.mask).sum())
        return world.gather_rows(old), world.sum([entropy_sum])[0]

    def _update(self, batch: TrainBatch, old: torch.Tensor | None, total: int) -> Update:
        """One optimizer step on `batch` (this rank's share), a micro-batch at a time with gradients accumulated:
        each micro-batch's token mean weighted by its share of the `total` tokens of the whole mini-batch (every
        rank's), so the step's gradient is that of the whole batch's token mean. `old` (B, T-1): the anchor
        log-probs, or None: this forward's, detached."""
        self.optimizer.zero_grad(set_to_none=True)
        outs, entropy_sum = [], 0.0
        cfg, par = self.cfg, self.par
        for rows, part, logprobs, entropy in self._micro_forwards(batch, entropy_grad=cfg.entropy_coef > 0):
            anchor = logprobs.detach() if old is None else old[rows][:, : logprobs.shape[1]]
            out = grpo_loss(GRPOLossInputs(logprobs, anchor, part.sampler_logprobs, part.advantages, part.mask,
                                           self._reference_logprobs(part),
                                           entropy=entropy if cfg.entropy_coef else None),
                            clip_eps=cfg.clip_eps, kl_coef=cfg.kl_coef, is_cap=cfg.is_cap,
                            clip_eps_high=cfg.clip_eps_high, entropy_coef=cfg.entropy_coef)
            (out.loss * (out.num_tokens / total * par.loss_scale)).backward()
            outs.append(out)
            entropy_sum += float((entropy.detach() * part.mask).sum())
        grad_norm = par.clip_grad_norm(self.params, cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return Update(outs, grad_norm, entropy_sum)

    def _reference_logprobs(self, part: TrainBatch) -> torch.Tensor | None:
        if self.reference is None:
            return None
        with torch.no_grad():
            return self._logprobs(self.reference, part)[0]


def _tokens(batch: TrainBatch) -> int:
    return max(1, int(batch.mask.sum()))


TERMS = ("loss", "pg_loss", "kl", "clip_frac", "is_weight_mean", "is_truncated_frac", "sampler_kl")


def _summarise(updates: list[Update], train_entropy: float, world: World = World()) -> TrainStats:
    """Token-weighted means of the loss terms over an update's optimizer steps, their micro-batches and the ranks."""
    outs = [o for u in updates for o in u.outs]
    value = lambda o, term: o.loss.item() if term == "loss" else getattr(o, term)  # noqa: E731
    *sums, tokens = world.sum([*(sum(value(o, t) * o.num_tokens for o in outs) for t in TERMS),
                               sum(o.num_tokens for o in outs)])
    means = {t: s / (tokens or 1) for t, s in zip(TERMS, sums, strict=True)}
    return TrainStats(**means, train_entropy=train_entropy,
                      grad_norm=sum(u.grad_norm for u in updates) / len(updates), optimizer_steps=len(updates))
