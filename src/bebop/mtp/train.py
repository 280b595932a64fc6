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
This module is the run (the learner, the loop, its saves and early stop); its settings are train_config.py,
one step's loss train_step.py, the sequences train_data.py.

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
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from bebop.decoding import DecodeSpec
from bebop.distributed.learner import Learner, join_world
from bebop.distributed.parallel import Parallel
from bebop.distributed.world import World
from bebop.errors import BebopError
from bebop.loggers import LoggerNames
from bebop.losses import DraftLossOutput
from bebop.metrics_log import MetricsLog
from bebop.model.checkpoint import save_model
from bebop.model.mtp import MTP_PREFIX
from bebop.mtp.data import Sequence
from bebop.mtp.patience import Patience
from bebop.mtp.train_config import MTPTrainConfig, saved_config
from bebop.mtp.train_data import load_data_ranked, split_held_out
from bebop.mtp.train_step import ChainBatch, DraftChains, chain_step, freeze_trunk, loss_at, make_batch
from bebop.policy import Policy, load_policy, resolve_device
from bebop.precision import train_autocast
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
METRICS_FILE = "mtp_metrics.jsonl"


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
class _HeadTraining:
    """What the loop needs: the policy, the learner (its wrapped forward over the ranks, the head's optimizer) and the
    head's parameters."""

    policy: Policy
    learner: Learner
    params: list[torch.nn.Parameter]
    cfg: MTPTrainConfig
    out: Path

    @property
    def world(self) -> World:
        return self.learner.world

    @property
    def par(self) -> Parallel:
        return self.learner.par


def _learner(policy: Policy, cfg: MTPTrainConfig, world: World, parallel: str, out: Path) -> _HeadTraining:
    """The trunk frozen, the training forward wrapped (FSDP2 shards the frozen trunk too: it is the memory), and
    AdamW over the head's (wrapped) parameters."""
    freeze_trunk(policy)
    par = Parallel(world, parallel, policy.model, DraftChains(policy.model, cfg.depths, policy.pad_id))
    params = policy.model.head_parameters()
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.95))  # float32 state: float32 params
    return _HeadTraining(policy, Learner(par, opt), params, cfg, out)


def _train_step(run: _HeadTraining, batch: ChainBatch, step: int) -> tuple[DraftLossOutput, dict]:
    """One optimizer step on this rank's share: the chain loss forward in the training precision, backward (the
    share's mean weighted by its share of every rank's chains), clip, AdamW -> (output, the step's metrics)."""
    cfg, world, optimizer = run.cfg, run.world, run.learner.optimizer
    for g in optimizer.param_groups:
        g["lr"] = cfg.lr * min(1.0, (step + 1) / 20)
    with train_autocast(run.policy.model.device, cfg.dtype):
        result = chain_step(run.policy, batch, cfg, loss_at(step, cfg), run.par.forward)
    optimizer.zero_grad(set_to_none=True)
    metrics = _step_metrics(result, world)
    share = result.num_chains / max(1, metrics["num_chains"]) if world.distributed else 1.0
    (result.loss * (share * run.par.loss_scale)).backward()
    run.par.clip_grad_norm(run.params, cfg.grad_clip)
    optimizer.step()
    run.learner.stepped()
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


def _save(run: _HeadTraining, step: int, rng: random.Random, watch: Patience, stopped: bool = False) -> None:
    """The model, then the train state, by rank 0 from the gathered weights (every rank calls)."""
    state = run.learner.gathered()
    if state is None:
        return
    full, optimizer = state
    full.eval()
    save_model(full, run.out)  # in the model's declared dtype
    save_train_state(run.out, {"config": asdict(run.cfg), "step": step, "optimizer": optimizer,
                               "data_rng": rng.getstate(), "rng": rng_state(), "learner": run.par.describe(),
                               "head": master_weights(full, MTP_PREFIX), "patience": watch.state(),
                               "stopped": stopped}, STATE_FILE)  # stopped: by --patience, before --steps
    full.train()


def _held_out_measure(policy: Policy, held: list[Sequence], cfg: MTPTrainConfig) -> float:
    from bebop.mtp.heldout import expected_acceptance

    return expected_acceptance(policy, held, k=cfg.eval_k, temperature=cfg.temperature, seed=cfg.seed)["rs"]["rate"]


def train_mtp(model_dir: str | Path, cfg: MTPTrainConfig, *, out: str | Path | None = None, resume: bool = False,
              progress: bool = True, data_cache: str | Path | None = None, loggers: LoggerNames = (),
              device: str = "auto", vllm: DecodeSpec | None = None, parallel: str = "fsdp") -> dict:
    """Train the head of the model in `model_dir` on `device` (auto, cpu, cuda, cuda:N); write it to `out`
    (default: model_dir). Per-step metrics: OUT/mtp_metrics.jsonl (and the trackers in `loggers`: bebop.loggers).
    The device is not part of the run: a run resumes on another one. With --held-out and --eval-every the head
    with the best held-out expected acceptance is the one saved (and --patience stops when it stops improving).
    Under torchrun each rank trains its share of every batch (`parallel`: fsdp or ddp, bebop.distributed); rank 0 writes."""
    world, device = join_world(device, parallel, loggers, cfg.batch_size)  # before anything is written
    out = Path(out or model_dir)
    policy, state = _start(Path(model_dir), out, cfg, resume, device)
    if state is not None and state.get("stopped"):  # patience ran out: the run is done
        return _summary(cfg, out, state["step"], Patience.from_state(state["patience"]), None, 0.0)
    data, held = split_held_out(load_data_ranked(policy, cfg, Path(model_dir), data_cache, progress, vllm,
                                                  world), cfg)
    if state is None and out != Path(model_dir) and world.is_main:
        save_model(policy.model, out)
        copy_tokenizer_files(model_dir, out)
    run = _learner(policy, cfg, world, parallel, out)
    rng, start, watch = random.Random(cfg.seed), 0, Patience(cfg.patience)
    if state is not None:
        start, watch = _restore(run, rng, state)
    log = run.learner.metrics_log(out, METRICS_FILE, start=start, loggers=loggers, tag="mtp", config=asdict(cfg))
    t0 = time.perf_counter()
    step = _train_loop(run, data, held, rng, watch, log, start, progress)
    log.close()
    return _summary(cfg, out, step, watch, log.last, time.perf_counter() - t0) | run.learner.summary()


def _restore(run: _HeadTraining, rng: random.Random, state: dict) -> tuple[int, Patience]:
    run.learner.restore(state["optimizer"])  # moves the state onto the parameters' device
    rng.setstate(state["data_rng"])
    set_rng_state(state["rng"])
    watch = Patience.from_state(state["patience"]) if "patience" in state else Patience(0)
    return state["step"], watch


def _measure(run: _HeadTraining, held: list[Sequence], watch: Patience, step: int, row: dict) -> bool:
    """The held-out measure (rank 0, on the whole model; every rank learns it) -> True: patience ran out."""
    full = run.par.full_model()
    value = round(_held_out_measure(replace(run.policy, model=full), held, run.cfg), 6) if full is not None else None
    row["heldout_rs_acceptance"] = value = run.world.broadcast(value)
    if step <= run.cfg.ce_warmup_steps:  # a head of --loss: the warm-up's ce heads are neither kept nor counted
        return False
    return watch.update(value, step, full)


def _keep_best(run: _HeadTraining, watch: Patience) -> None:
    """The best measured head back in the model on every rank (no-op without a held-out measure)."""
    best = run.world.broadcast(watch.best_head)
    if best is not None:
        run.par.load_full_state(best, strict=False)


def _train_loop(run: _HeadTraining, data: list[Sequence], held: list[Sequence], rng: random.Random, watch: Patience,
                log: MetricsLog, start: int, progress: bool) -> int:
    """Steps start+1 .. cfg.steps (or until patience runs out); -> the last step trained. Saves every
    --save-every steps and at the end, the best held-out head in the model when there is a held-out measure."""
    cfg, policy = run.cfg, run.policy
    policy.model.train()
    bar = run.learner.progress(start, cfg.steps, desc=f"mtp {cfg.loss}", enabled=progress)
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
