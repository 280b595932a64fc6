"""The RL run: setup or resume, then one step at a time (fetch batch, update, sync, log, save).

    summary = train_rl("runs/rl-math", RLConfig(model="runs/policy-math", task="math", steps=50))

RUN_DIR holds config.json (the resolved RLConfig), metrics.jsonl (one object per step),
ckpt-<step>/ + LATEST (the resumable checkpoint: model dir with the head, optimizer states,
random states, data position, step, policy version) and, when finished, model/ (the final
policy with its head). `resume=True` continues from LATEST; a different config is an error that
names the fields.

Sync and async differ only in the rollout source (SOURCES[(backend, mode)]: sync and async in this
process, async on Ray actors with `backend=Backend("ray", ...)`): the step itself is the same, and
every batch carries the policy version that sampled it.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from bebop.distributed.learner import join_world
from bebop.distributed.parallel import Logits, Parallel
from bebop.distributed.world import World
from bebop.engine.speculative import AUTO
from bebop.errors import BebopError
from bebop.fields import flat_dict
from bebop.fileio import atomic_write_json
from bebop.jsonl import read_jsonl
from bebop.loggers import LoggerNames
from bebop.model.checkpoint import load_model, release_dtype, write_model_dir
from bebop.model.qwen3 import CausalLM
from bebop.policy import Policy, load_policy
from bebop.progress import write as progress_write
from bebop.rl.async_loop import AsyncSource
from bebop.rl.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from bebop.rl.config import Backend, RLConfig, check_learner_ranks, run_identity
from bebop.rl.drafter_alarm import CLEARED, RAISED, DrafterAlarm
from bebop.rl.evaluation import Evaluator
from bebop.rl.flat_rewards import WATCH_STEPS, FlatRewards
from bebop.rl.metrics import METRICS_FILE, StepMetrics, length_percentiles
from bebop.rl.mtp_online import OnlineMTP, make_online_mtp
from bebop.rl.ray_backend import RaySource
from bebop.rl.ray_connect import preflight
from bebop.rl.rollout_dump import dump_rollouts
from bebop.rl.sampler import RolloutSampler
from bebop.rl.source import Fetched, RolloutSource
from bebop.rl.summary import last_steps_means
from bebop.rl.sync_source import SyncSource
from bebop.rl.trainer import PolicyTrainer, TrainStats, frozen_reference
from bebop.rl.vllm_source import VllmAsyncSource, VllmSource
from bebop.tasks.dataset_task import load_dataset_task, run_task

if TYPE_CHECKING:
    from bebop.vllm.serve import VllmServer
from bebop.train_state import (
    check_same_config,
    master_weights,
    restore_master_weights,
    rng_state,
    set_rng_state,
    with_defaults,
)

CONFIG_FILE = "config.json"
FINAL_MODEL = "model"
SOURCES: dict[tuple[str, str], Callable[..., RolloutSource]] = {
    ("local", "sync"): SyncSource, ("local", "async"): AsyncSource, ("ray", "async"): RaySource}


def _prepare(out: Path, cfg: RLConfig, resume: bool) -> Checkpoint | None:
    """Check the run directory against the request; the checkpoint to resume, if any."""
    saved_cfg = out / CONFIG_FILE
    if not resume:
        if saved_cfg.exists():
            raise BebopError(f"{out} already holds an RL run; pass --resume to continue it or choose another --out")
        return None
    if not saved_cfg.exists():
        raise BebopError(f"nothing to resume: no {CONFIG_FILE} in {out}")
    saved = with_defaults(RLConfig, json.loads(saved_cfg.read_text()))
    check_same_config(run_identity(saved), run_identity(flat_dict(cfg)), out)
    return load_checkpoint(out)


def _require_head(policy: Policy, cfg: RLConfig) -> None:
    if cfg.needs_head and policy.model.mtp is None:
        raise BebopError(f"--spec {cfg.decode.spec} / --mtp-update {cfg.mtp_update} needs an MTP head, and the model in "
                         f"{cfg.model} has none; add one with `bebop mtp init --model {cfg.model}` and train it with "
                         f"`bebop mtp train --model {cfg.model}` (or use --spec off --mtp-update none)")


def _restore(ckpt: Checkpoint | None, trainer: PolicyTrainer, online: OnlineMTP | None) -> tuple[int, int]:
    """Load optimizer and random states; -> (start step, data position)."""
    if ckpt is None:
        return 0, 0
    state = ckpt.state
    trainer.par.load_optimizer_state(trainer.optimizer, state["optimizer"])
    if online is not None:
        online.optimizer.load_state_dict(state["mtp_optimizer"])
    set_rng_state(state["rng"])
    return state["step"], state["data_index"]


def _checkpoint_state(cfg: RLConfig, step: int, data_index: int, trainer: PolicyTrainer,
                      online: OnlineMTP | None, alarm: DrafterAlarm, model: CausalLM, optimizer: dict) -> dict:
    """The resumable state beside the checkpoint's model directory (`model`: the whole model, `optimizer`: its
    state in one process's layout, both gathered on rank 0)."""
    rounded = release_dtype(model) != model.dtype  # then the model directory alone would not resume exactly
    return {"config": flat_dict(cfg), "step": step, "policy_version": trainer.policy_version, "data_index": data_index,
            "drafter_alarm": alarm.state(), "learner": trainer.par.describe(),
            "optimizer": optimizer,
            "mtp_optimizer": online.optimizer.state_dict() if online is not None else None, "rng": rng_state(),
            "masters": master_weights(model) if rounded else None}


def _watch_drafter(alarm: DrafterAlarm, spec, source, cfg: RLConfig) -> None:
    """Feed the step's acceptance to the alarm; warn once when it is raised; with --k auto the
    rollouts stop drafting while it is up (see drafter_alarm.py)."""
    change = alarm.observe(spec)
    if change == RAISED:
        progress_write(alarm.message(spec))
    elif change == CLEARED:
        progress_write("bebop: drafter alarm cleared: first-draft acceptance is back above the line")
    if change is not None and cfg.decode.k == AUTO:
        source.suspend_drafting(alarm.raised)


def step_metrics(step: int, fetched: Fetched, stats: TrainStats, trainer_version: int, mtp, train_s: float,
                 step_s: float, alarm: bool) -> StepMetrics:
    """The metrics record of one step (trainer_version: the version the batch was trained at)."""
    b = fetched.batch
    rewards = b.rewards
    spec = b.spec
    return StepMetrics(
        step=step, policy_version=b.policy_version, staleness=trainer_version - b.policy_version,
        dropped=fetched.dropped, reward=sum(rewards) / len(rewards), pass_rate=b.pass_rate,
        reward_errors=b.reward_errors, entropy=b.entropy,
        train_entropy=stats.train_entropy,
        mean_acceptance_length=spec.mean_acceptance_length if spec else 1.0,
        acceptance_rate=spec.acceptance_rate if spec else None,
        acceptance_rate_per_position=spec.acceptance_rate_per_position if spec else [],
        k_histogram=spec.to_dict()["k_histogram"] if spec else {},
        drafts_by_source=spec.to_dict()["by_source"] if spec else {},
        rollout_s=b.rollout_s, wait_s=fetched.wait_s, train_s=train_s, step_s=step_s,
        generated_tokens=b.generated_tokens, tokens_per_s=b.generated_tokens / max(b.rollout_s, 1e-9),
        **length_percentiles([r.num_policy_tokens for r in b.rollouts]),
        truncated_frac=sum(r.truncated for r in b.rollouts) / len(b.rollouts),
        loss=stats.loss, pg_loss=stats.pg_loss, kl=stats.kl, clip_frac=stats.clip_frac,
        is_weight_mean=stats.is_weight_mean, is_truncated_frac=stats.is_truncated_frac, sampler_kl=stats.sampler_kl,
        optimizer_steps=stats.optimizer_steps, drafter_alarm=alarm, grad_norm=stats.grad_norm,
        mtp_loss=mtp.loss if mtp is not None else None,
        mtp_acceptance_per_depth=mtp.acceptance_per_depth if mtp is not None else [])


def _start_vllm(policy: Policy, cfg: RLConfig, backend: Backend) -> VllmServer | None:
    """With --engine vllm on the local backend: a vLLM worker serving the policy's weights now (its head drafting
    with --spec), on the trainer's device. On Ray each rollout actor starts its own."""
    if cfg.decode.engine != "vllm" or backend.name == "ray":
        return None
    from bebop.vllm.serve import VllmServer

    return VllmServer(policy.model, cfg.model, beside_trainer=True, **cfg.vllm_server())


def make_source(backend: Backend, cfg: RLConfig, sampler: RolloutSampler, model: CausalLM, *, start_index: int,
                policy_version: int, server: VllmServer | None = None) -> RolloutSource:
    """The rollout source for (backend, mode), from the SOURCES table; on vLLM (`server`) the vLLM source."""
    if server is not None:
        on_vllm = VllmSource if cfg.mode == "sync" else VllmAsyncSource
        return on_vllm(sampler, model, server, start_index=start_index, policy_version=policy_version,
                       max_staleness=cfg.max_staleness)
    kind = SOURCES[(backend.name, cfg.mode)]
    extra = {"workers": backend.rollout_workers, "address": backend.ray_address,
             "vllm": ray_vllm(cfg)} if backend.name == "ray" else {}
    return kind(sampler, model, start_index=start_index, policy_version=policy_version,
                max_staleness=cfg.max_staleness, **extra)


def ray_vllm(cfg: RLConfig) -> dict | None:
    """With --engine vllm: the vLLM server each Ray rollout actor starts (its Python resolved here, where the flag
    and $BEBOP_VLLM_PYTHON are)."""
    if cfg.decode.engine != "vllm":
        return None
    from bebop.vllm.client import vllm_python

    server = cfg.vllm_server()
    return {**server, "source_dir": str(Path(cfg.model).resolve()), "python": vllm_python(server["python"])}


def train_rl(out: str | Path, cfg: RLConfig, *, resume: bool = False, progress: bool = True,
             loggers: LoggerNames = (), device: str = "auto", backend: Backend = Backend(),
             parallel: str = "fsdp") -> dict:
    """Run (or resume) GRPO in `out`; return a summary of the last steps (rl/summary.py). Under torchrun each rank
    updates with its share of every batch (`parallel`: fsdp or ddp, bebop.distributed); rank 0 samples, broadcasts each
    batch, and writes."""
    backend.validate(cfg)
    world, device = join_world(device, parallel, loggers)
    check_learner_ranks(cfg, world.size)
    if backend.name == "ray" and world.is_main:
        ray_vllm(cfg)  # its Python checked
        preflight(backend.ray_address)  # before anything is written to the run directory
    out = Path(out)
    ckpt = _prepare(out, cfg, resume)
    policy = load_policy(ckpt.model_dir if ckpt else cfg.model, device=device, template_kwargs=cfg.chat_template_kwargs)
    _require_head(policy, cfg)
    task = run_task(policy, task=cfg.task, difficulty=cfg.difficulty, data=cfg.data, reward=cfg.reward)
    evaluator = Evaluator(load_dataset_task(cfg.eval_data, policy, reward=cfg.reward), cfg, policy) \
        if cfg.eval_data else None
    sampler = RolloutSampler(task, policy, cfg)
    sampler.check_expressible(policy)
    server = _start_vllm(policy, cfg, backend)  # vLLM's own reason when it cannot serve the model, before any write
    try:
        world.barrier()  # every rank has checked its inputs: only now is anything written
        if world.is_main:
            out.mkdir(parents=True, exist_ok=True)
            atomic_write_json(out / CONFIG_FILE, flat_dict(cfg))
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        run = _run_state(policy, cfg, ckpt, world, parallel)
        view = run.trainer.par.full_model()  # rank 0's whole model: what the rollouts sample with
        source = make_source(backend, cfg, sampler, view, start_index=run.data_index,
                             policy_version=run.trainer.policy_version, server=server) if view else None
    except BaseException:
        if server is not None:
            server.close()
        raise
    if source is not None and run.alarm.raised and cfg.decode.k == AUTO:
        source.suspend_drafting(True)
    _run_steps(out, cfg, run, source, evaluator, progress=progress, loggers=loggers)
    trainer = run.trainer
    view = trainer.par.full_model()
    if view is not None:
        write_model_dir(view, Path(cfg.model), out / FINAL_MODEL)
    rows = read_jsonl(out / METRICS_FILE) if world.is_main else []  # the whole run's steps, resumed or not
    return {"steps": cfg.steps, "run_dir": str(out), "model_dir": str(out / FINAL_MODEL),
            "policy_version": trainer.policy_version, **last_steps_means(rows), **trainer.learner.summary()}


@dataclass
class RunState:
    """The driver's side of a run: the policy update, the online head update, the drafter alarm, the
    flat-reward watch, and where the run starts (restored from the checkpoint on resume)."""

    trainer: PolicyTrainer
    online: OnlineMTP | None
    alarm: DrafterAlarm
    start: int  # steps already done
    data_index: int  # the next batch of the prompt stream
    flat: FlatRewards  # warns once when the first steps have no advantage


def restore_masters(model: CausalLM, ckpt: Checkpoint | None) -> None:
    """The checkpoint's exact weights, where its model directory holds them rounded to its dtype (before sharding)."""
    if ckpt is not None and ckpt.state.get("masters"):
        restore_master_weights(model, ckpt.state["masters"])


def _run_state(policy: Policy, cfg: RLConfig, ckpt: Checkpoint | None, world: World = World(),
               parallel: str = "fsdp") -> RunState:
    """The trainer over the ranks (the exact weights of a checkpoint restored before they are sharded), the
    online head update, the drafter alarm, and where the run starts."""
    reference = frozen_reference(load_model(cfg.model, device=policy.model.device)) if cfg.kl_coef > 0 else None
    restore_masters(policy.model, ckpt)
    if world.distributed:  # the loss never reaches the head (no online update across ranks: check_learner_ranks)
        policy.model.requires_grad_(True)
        for p in policy.model.head_parameters():
            p.requires_grad_(False)
    par = Parallel(world, parallel, policy.model, Logits(policy.model))
    trainer = PolicyTrainer(policy, cfg, reference=reference,
                            policy_version=ckpt.state["policy_version"] if ckpt else 0, par=par)
    online = make_online_mtp(policy, cfg)
    start, data_index = _restore(ckpt, trainer, online)
    saved_alarm = ckpt.state.get("drafter_alarm") if ckpt else None
    return RunState(trainer, online, DrafterAlarm(**saved_alarm) if saved_alarm else DrafterAlarm(), start, data_index,
                   FlatRewards(cfg, min(WATCH_STEPS, cfg.steps) if start == 0 else 0))  # a resumed run was told


def _run_steps(out: Path, cfg: RLConfig, run: RunState, source: RolloutSource | None,
               evaluator: Evaluator | None, *, progress: bool, loggers: LoggerNames) -> None:
    """Steps run.start+1 .. cfg.steps: fetch, update, publish, watch the drafter, evaluate, log, save. Rank 0
    holds the source (other ranks: None) and writes."""
    learner = run.trainer.learner
    writer = learner.metrics_log(out, METRICS_FILE, start=run.start, loggers=loggers, tag="rl", config=flat_dict(cfg))
    bar = learner.progress(run.start, cfg.steps, desc=f"rl {cfg.prompts_name} {cfg.mode}", enabled=progress)
    threads = torch.get_num_threads()
    if cfg.mode == "async" and cfg.train_threads:
        torch.set_num_threads(cfg.train_threads)
    try:
        for step in range(run.start, cfg.steps):
            m, view = _step(step + 1, out, cfg, run, source, evaluator)
            if m is not None:
                writer.write(asdict(m))
                bar.set_postfix(reward=f"{m.reward:.3f}", accept_len=f"{m.mean_acceptance_length:.2f}",
                                **_by_source_postfix(m.drafts_by_source))
            if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
                _save(out, step + 1, cfg, run, source, view)
            bar.update()
    finally:
        if source is not None:
            source.close()
        bar.close()
        writer.close()
        torch.set_num_threads(threads)


def _by_source_postfix(by_source: dict) -> dict:
    """With more than one drafter: each source's accept length for the progress bar (e.g. suffix=2.14)."""
    if len(by_source) < 2:
        return {}
    return {source: f"{got['mean_acceptance_length']:.2f}" for source, got in sorted(by_source.items())}


def _step(step: int, out: Path, cfg: RLConfig, run: RunState, source: RolloutSource | None,
          evaluator: Evaluator | None) -> tuple[StepMetrics | None, CausalLM | None]:
    """One step on every rank: rank 0 fetches and broadcasts the batch, every rank updates on its share, the
    weights are gathered once for the sampler (FSDP), and rank 0 publishes them -> rank 0's metrics and whole
    model (else None, None)."""
    trainer, online, alarm = run.trainer, run.online, run.alarm
    t0 = time.perf_counter()
    fetched = trainer.par.world.broadcast(source.next_batch(trainer.policy_version) if source is not None else None)
    trained_at = trainer.policy_version
    t1 = time.perf_counter()
    stats = trainer.step(fetched.batch)
    mtp = online.update(fetched.batch.rollouts) if online is not None else None
    view = trainer.par.full_model()  # the weight sync: gathered from the shards once per step
    if source is None or view is None:
        return None, None
    source.publish(view, trainer.policy_version)
    _watch_drafter(alarm, fetched.batch.spec, source, cfg)
    if warning := run.flat.observe(fetched.batch):
        progress_write(warning)
    t2 = time.perf_counter()
    m = step_metrics(step, fetched, stats, trained_at, mtp, t2 - t1, t2 - t0, alarm.raised)
    if evaluator is not None and evaluator.due(step):
        m.eval_reward, m.eval_pass_rate = evaluator.run(replace(trainer.policy, model=view))
    if cfg.dump_rollouts:
        dump_rollouts(out, step, fetched.batch, trainer.policy.codec)
    return m, view


def _save(out: Path, step: int, cfg: RLConfig, run: RunState, source: RolloutSource | None,
          view: CausalLM | None) -> None:
    """The checkpoint, written by rank 0 from the step's gathered weights (`view`) and the optimizer state
    gathered now (every rank calls)."""
    trainer = run.trainer
    optimizer = trainer.par.optimizer_state(trainer.optimizer)  # the weights were gathered for the sampler: `view`
    if view is None or source is None or optimizer is None:
        return
    save_checkpoint(out, step, view, cfg.model, _checkpoint_state(cfg, step, source.next_index, trainer,
                                                                  run.online, run.alarm, view, optimizer))
