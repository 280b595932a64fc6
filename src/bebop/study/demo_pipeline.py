"""The demo: the method's study, end to end on the embedded default, resumable stage by stage.

    report = run_demo_pipeline("runs/demo", DemoConfig())          # `bebop demo --out runs/demo`
    report = run_demo_pipeline(tmp, DemoConfig.miniature())        # the same pipeline in ~a minute

Stages (each writes its results file atomically when complete and is skipped when it exists; see
bebop.study.layout for the files):
  1. policy  train the small policy by SFT (resumed from its train_state.pt), or reuse a trained one
  2. heads   one MTP head per loss (ce, e2e_tv) from the same init, data, steps and seed
             (the loss study's pieces; resumed from mtp_train_state.pt)
  3. sweep   RS and TO acceptance of each head, and the mean target entropy, per temperature
  4. rl      short GRPO runs, {sync, async} x {spec off, rs}, same seeds (train_rl resumes them),
             and sync rs again with the head updated online by each strategy in `rl_online`
  5. report  DIR/report.md and DIR/plots/*.png, rebuilt from the results alone (`bebop report DIR`)
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from bebop.decoding import DecodeSpec
from bebop.errors import BebopError
from bebop.fileio import atomic_write_json
from bebop.mtp.data import sample_sequences
from bebop.mtp.diagnostics import draft_diagnostics
from bebop.mtp.evaluate import evaluate_mtp
from bebop.mtp.train import STATE_FILE as HEAD_STATE_FILE
from bebop.mtp.train import train_mtp
from bebop.mtp.train_config import MTPTrainConfig
from bebop.policy import load_policy
from bebop.rl import RLConfig, train_rl
from bebop.rl.loop import CONFIG_FILE as RL_CONFIG_FILE
from bebop.rl.loop import FINAL_MODEL
from bebop.sft import DEFAULT_STEPS, SFTConfig, is_trained, read_meta, train_sft
from bebop.study.layout import DemoLayout, rl_name
from bebop.study.loss_table import headed_copy
from bebop.tasks import get_task
from bebop.train_state import STATE_FILE as SFT_STATE_FILE
from bebop.train_state import config_diff

MODES = ("rs", "to")
# the tiny model of the miniature configuration (as in tests/test_sft.py)
TINY_MODEL = (("hidden_size", 32), ("intermediate_size", 64), ("num_hidden_layers", 1), ("num_attention_heads", 2),
              ("num_key_value_heads", 1), ("head_dim", 16), ("max_position_embeddings", 256))


@dataclass(frozen=True)
class DemoConfig:
    """Every size of the demo. The default takes about 24 minutes on 2 CPU cores from scratch
    (11.5 with the policy reused; docs/example-report):

    stage                       default sizes                                   measured (2 CPU cores, 2026-11-30)
    1. policy (SFT)             600 steps x 32 sequences, 12-layer default      ~12.5 min (765 s); 0 if reused
    2. heads ce + e2e_tv        192 self-distilled samples, then 2 x 100 steps   ~0.5 min + 2 x ~2.6 min
                                x 16 sequences over 5 depths
    3. sweep                    2 heads x {RS, TO} x 5 temperatures, 32 prompts  ~1 min
    4. RL                       9 runs x 8 steps x (8 prompts x 8 samples),      ~6 min (6-8 s per step,
                                up to 384 tokens, k auto; the fifth updates     ~13 with the online update;
                                the head online (ce), the sixth and seventh     the drafter runs: 2.0-2.3 s a step
                                draft from the rollouts' text (suffix, both);   in rl_step.py, 2026-12-03; the
                                the last two: off and rs, difficulty 2          long pair 3.0-3.8 s a step)
    Times from one real run (docs/example-report); the report has its own stage-time table.
    """

    name: str = "full"  # "miniature" marks the smoke-test configuration in the report
    task: str = "math"
    seed: int = 0
    # 1. policy: SFT from scratch in DIR/policy, unless `policy` names a trained model directory
    policy: str = ""
    policy_steps: int = DEFAULT_STEPS["math"]
    policy_batch_size: int = 32
    policy_pool: int = 20000
    policy_overrides: tuple = ()  # model config overrides (the miniature's tiny model)
    # 2. heads: same init, data, steps and seed for every loss
    losses: tuple = ("ce", "e2e_tv")
    head_steps: int = 100
    head_ce_warmup: float = 0.5  # non-ce heads train with ce first (docs/results/loss-math-*.md)
    head_depths: int = 5
    head_batch_size: int = 16
    head_samples: int = 192  # self-distillation samples
    head_max_new_tokens: int = 192
    # 3. sweep: acceptance (RS and TO) and entropy per temperature, on the same test prompts
    k: int = 3
    temperatures: tuple = (0.3, 0.5, 0.7, 1.0, 1.3)
    table_temperature: float = 1.0  # the loss table's temperature (one of `temperatures`)
    eval_n: int = 32
    eval_max_new_tokens: int = 384  # the long tail: the longest math solutions are ~340 tokens
    entropy_bins: int = 10  # the per-token entropy law: quantile bins of every verified draft (0 = off)
    # 4. RL: GRPO from the rl_head model, {sync, async} x {off, rs}, same seeds
    rl_head: str = "e2e_tv"
    rl_modes: tuple = ("sync", "async")
    rl_specs: tuple = ("off", "rs")
    rl_online: tuple = ("ce",)  # online MTP strategies run as sync rs beside the frozen head (report 5b)
    rl_drafters: tuple = ("suffix", "both")  # other drafters run as sync rs beside the head's (report 5c)
    rl_long_specs: tuple = ("off", "rs")  # the long-response configuration, sync: harder prompts, longer answers
    rl_long_difficulty: int = 2  # its task difficulty (math: responses p50 ~80 tokens against ~50, same max)
    rl_steps: int = 8
    rl_group_size: int = 8
    rl_batch_prompts: int = 8
    rl_max_new_tokens: int = 384
    rl_k: int | str = "auto"  # drafts per step in the rs runs (adaptive, up to 6)
    rl_rollout_threads: int = 0  # async runs: torch threads of the rollout worker and of the trainer
    rl_train_threads: int = 0  # (0 = torch's default: measured better than one core each, docs/benchmarks.md)
    rl_save_every: int = 4
    rl_warmup_steps: int = 1  # steps left out of the median step time (first-call overheads)

    @classmethod
    def miniature(cls) -> DemoConfig:
        """A tiny model and a few steps per stage: the whole pipeline in well under a minute
        (for tests and smoke runs; its numbers say nothing about the method)."""
        return cls(name="miniature", policy_steps=12, policy_batch_size=8, policy_pool=200, policy_overrides=TINY_MODEL,
                   head_steps=8, head_depths=3, head_batch_size=8, head_samples=16, head_max_new_tokens=24,
                   temperatures=(0.5, 1.0, 1.5), eval_n=6, eval_max_new_tokens=24,
                   rl_steps=3, rl_group_size=2, rl_batch_prompts=2, rl_max_new_tokens=16, rl_save_every=2)

    def validate(self) -> None:
        get_task(self.task)
        if not self.losses:
            raise BebopError("the demo needs at least one head loss")
        if self.rl_head not in self.losses:
            raise BebopError(f"rl_head {self.rl_head!r} is not one of the trained heads {self.losses}")
        if len(set(self.temperatures)) < 2 or any(not t > 0 for t in self.temperatures):
            raise BebopError("the sweep needs at least 2 distinct temperatures > 0 (to fit the entropy law)")
        if self.table_temperature not in self.temperatures:
            raise BebopError(f"table_temperature {self.table_temperature} is not in temperatures {self.temperatures}")
        if not 0 <= self.rl_warmup_steps < self.rl_steps:
            raise BebopError(f"need 0 <= rl_warmup_steps < rl_steps, got {self.rl_warmup_steps} and {self.rl_steps}")
        self.head_configs()  # MTPTrainConfig and RLConfig check themselves when they are made
        self.rl_configs(Path("."))

    def sft_config(self) -> SFTConfig:
        return SFTConfig(task=self.task, steps=self.policy_steps, batch_size=self.policy_batch_size,
                         pool=self.policy_pool, seed=self.seed, model_overrides=tuple(self.policy_overrides))

    def head_configs(self) -> dict[str, MTPTrainConfig]:
        return {loss: MTPTrainConfig(loss=loss, depths=self.head_depths, steps=self.head_steps,
                                     batch_size=self.head_batch_size, seed=self.seed, task=self.task,
                                     num_samples=self.head_samples, max_new_tokens=self.head_max_new_tokens,
                                     save_every=max(1, self.head_steps // 3),
                                     ce_warmup_steps=0 if loss == "ce" else int(self.head_ce_warmup * self.head_steps))
                for loss in self.losses}

    def rl_configs(self, model: Path) -> dict[str, RLConfig]:
        """Run name (layout.rl_name) -> its run's config."""
        runs = [(mode, spec, "none", "mtp", False) for mode in self.rl_modes for spec in self.rl_specs]
        runs += [("sync", "rs", update, "mtp", False) for update in self.rl_online if update != "none"]
        runs += [("sync", "rs", "none", drafter, False) for drafter in self.rl_drafters if drafter != "mtp"]
        runs += [("sync", spec, "none", "mtp", True) for spec in self.rl_long_specs]
        return {rl_name(*run): self._rl_config(model, *run) for run in runs}

    def _rl_config(self, model: Path, mode: str, spec: str, update: str, drafter: str, long: bool) -> RLConfig:
        return RLConfig(
            model=str(model), task=self.task, steps=self.rl_steps, mode=mode,
            decode=DecodeSpec(spec=spec, k=self.rl_k if spec != "off" else DecodeSpec.k, drafter=drafter),
            group_size=self.rl_group_size, batch_prompts=self.rl_batch_prompts,
            max_new_tokens=self.rl_max_new_tokens, seed=self.seed, save_every=self.rl_save_every, mtp_update=update,
            difficulty=self.rl_long_difficulty if long else RLConfig.difficulty,
            rollout_threads=self.rl_rollout_threads if mode == "async" else 0,
            train_threads=self.rl_train_threads if mode == "async" else 0)

    def to_json(self) -> dict:
        return json.loads(json.dumps(asdict(self)))  # tuples -> lists, as read back from the file

    @classmethod
    def from_json(cls, data: dict) -> DemoConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise BebopError(f"unknown demo config fields: {', '.join(sorted(unknown))}")
        values: dict[str, Any] = {k: tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v
                                  for k, v in data.items()}  # lists (JSON) -> tuples, as the fields hold them
        return cls(**values)


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def check_config(layout: DemoLayout, cfg: DemoConfig) -> None:
    """Write DIR/demo_config.json, or refuse to mix a different configuration into DIR."""
    if layout.config.is_file():
        saved = {**DemoConfig().to_json(), **json.loads(layout.config.read_text())}  # added since: default
        diff = config_diff(saved, cfg.to_json())
        if diff:
            raise BebopError(f"{layout.root} holds a demo with another configuration (differs in {', '.join(diff)}); "
                             f"choose another --out")
        return
    atomic_write_json(layout.config, cfg.to_json())


def stage_policy(layout: DemoLayout, cfg: DemoConfig, progress: bool) -> Path:
    """-> the policy directory: `cfg.policy` as given, or DIR/policy trained (or resumed) here."""
    if layout.policy_result.is_file():
        return layout.root / json.loads(layout.policy_result.read_text())["model_dir"]
    t0 = time.perf_counter()
    if cfg.policy:
        model_dir, source = Path(cfg.policy), "reused (given with --policy)"
        load_policy(model_dir, device="cpu")  # fail now, not after an hour, on a bad directory
    else:
        model_dir = layout.policy_dir
        if is_trained(model_dir):
            source = "reused (already trained in this directory)"
        else:
            resume = (model_dir / SFT_STATE_FILE).is_file()
            if not resume and model_dir.exists():
                shutil.rmtree(model_dir)  # killed before its first save: nothing to resume
            say(f"{'resuming' if resume else 'training'} the {cfg.task} policy in {model_dir} "
                f"({cfg.policy_steps} SFT steps)")
            train_sft(model_dir, cfg.sft_config(), resume=resume, progress=progress)
            source = "trained by this demo"
    meta = read_meta(model_dir) if is_trained(model_dir) else {}
    rel = _relative(model_dir.resolve(), layout.root.resolve())
    atomic_write_json(layout.policy_result, {"model_dir": rel, "source": source, "task": cfg.task,
                                             "sft_steps": meta.get("steps"), "sft_final_loss": meta.get("final_loss"),
                                             "num_parameters": meta.get("num_parameters"),
                                             "seconds": round(time.perf_counter() - t0, 1)})
    return model_dir


def stage_head(layout: DemoLayout, cfg: DemoConfig, policy_dir: Path, loss: str, progress: bool) -> None:
    if layout.head_result(loss).is_file():
        return
    head_dir, mcfg = layout.head_dir(loss), cfg.head_configs()[loss]
    resume = (head_dir / HEAD_STATE_FILE).is_file()
    if not resume:
        headed_copy(policy_dir, layout.head_init, cfg.seed)  # the same fresh head for every loss
    say(f"{'resuming' if resume else 'training'} the {loss} head in {head_dir} ({mcfg.steps} steps, "
        f"{mcfg.depths} depths, {mcfg.num_samples} self-distilled samples)")
    t0 = time.perf_counter()
    summary = train_mtp(layout.head_init, mcfg, out=head_dir, resume=resume, progress=progress,
                        data_cache=layout.mtp_data, device="cpu")  # as before: the demo's --device is for eval and RL
    atomic_write_json(layout.head_result(loss), {
        "loss": loss, "head_dir": _relative(head_dir, layout.root), "config": asdict(mcfg),
        "final_loss": summary["loss"], "final_acceptance_per_depth": summary["acceptance_per_depth"],
        "metrics_log": _relative(head_dir / "mtp_metrics.jsonl", layout.root),
        "seconds": round(time.perf_counter() - t0, 1)})


def stage_sweep(layout: DemoLayout, cfg: DemoConfig, loss: str, progress: bool, device: str) -> None:
    if layout.sweep_result(loss).is_file():
        return
    say(f"sweeping temperatures {', '.join(f'{t:g}' for t in cfg.temperatures)} for the {loss} head "
        f"(RS and TO, K={cfg.k}, {cfg.eval_n} test prompts)")
    t0 = time.perf_counter()
    policy = load_policy(layout.head_dir(loss), device=device)
    rows = evaluate_mtp(policy, get_task(cfg.task), k=cfg.k, temperatures=list(cfg.temperatures), modes=list(MODES),
                        n=cfg.eval_n, seed=cfg.seed, max_new_tokens=cfg.eval_max_new_tokens, progress=progress,
                        entropy_bins=cfg.entropy_bins)
    task, t = get_task(cfg.task), cfg.table_temperature  # the paper's Fig. 11, on the policy's own test completions
    seqs = sample_sequences(policy, task, n=cfg.eval_n, temperature=t, seed=cfg.seed, split="test",
                            max_new_tokens=cfg.eval_max_new_tokens, progress=progress)
    diagnostics = draft_diagnostics(policy, seqs, depths=cfg.k, temperature=t)
    meta = {"head": loss, "head_dir": _relative(layout.head_dir(loss), layout.root), "task": cfg.task, "k": cfg.k,
            "n": cfg.eval_n, "seed": cfg.seed, "max_new_tokens": cfg.eval_max_new_tokens,
            "temperatures": list(cfg.temperatures), "modes": list(MODES), "split": "test",
            "seconds": round(time.perf_counter() - t0, 1)}
    atomic_write_json(layout.sweep_result(loss), {"meta": meta, "rows": rows, "diagnostics": diagnostics})


def stage_rl(layout: DemoLayout, name: str, rcfg: RLConfig, progress: bool, device: str) -> None:
    run = layout.rl_dir(name)
    if (run / FINAL_MODEL / "config.json").is_file():
        return
    resume = (run / RL_CONFIG_FILE).is_file()
    online = "" if rcfg.mtp_update == "none" else f", head updated online ({rcfg.mtp_update})"
    online += "" if rcfg.decode.drafter == "mtp" else f", drafts from {rcfg.decode.drafter}"
    online += "" if rcfg.difficulty == RLConfig.difficulty else f", difficulty {rcfg.difficulty} (long responses)"
    say(f"{'resuming' if resume else 'running'} GRPO {rcfg.mode}, spec {rcfg.decode.spec}{online} in {run} ({rcfg.steps} steps, "
        f"{rcfg.batch_prompts} prompts x {rcfg.group_size} samples)")
    train_rl(run, rcfg, resume=resume, progress=progress, device=device)


def run_demo_pipeline(out: str | Path, cfg: DemoConfig, *, progress: bool = True, device: str = "auto") -> Path:
    """Run (or resume) every stage in `out`, then write the report; -> the report's path."""
    from bebop.study.report import write_report

    cfg.validate()
    layout = DemoLayout(Path(out))
    layout.root.mkdir(parents=True, exist_ok=True)
    check_config(layout, cfg)
    say(f"[1/5] policy ({cfg.task})")
    policy_dir = stage_policy(layout, cfg, progress)
    say(f"[2/5] MTP heads: {', '.join(cfg.losses)}")
    for loss in cfg.losses:
        stage_head(layout, cfg, policy_dir, loss, progress)
    say("[3/5] temperature sweep")
    for loss in cfg.losses:
        stage_sweep(layout, cfg, loss, progress, device)
    say("[4/5] GRPO runs")
    for name, rcfg in cfg.rl_configs(layout.head_dir(cfg.rl_head).resolve()).items():
        stage_rl(layout, name, rcfg, progress, device)
    say("[5/5] report")
    report = write_report(layout.root)
    say(f"wrote {report}")
    return report


def _relative(path: Path, root: Path) -> str:
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return str(Path(path).resolve())
