"""`bebop mtp ...`: manage the MTP draft head of a model directory."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

from bebop.commands.config_flags import add_config_flags, add_field_flags, config_values
from bebop.commands.flags import add_learner_args, add_log_args, add_progress_args, check_at_least_one
from bebop.commands.outputs import add_out_dir, refuse_to_replace
from bebop.decoding import DecodeSpec
from bebop.distributed.world import World, env_world
from bebop.errors import BebopError
from bebop.model.checkpoint import save_model
from bebop.policy import load_policy
from bebop.tasks import TASK_LIST


def add_parser(sub: argparse._SubParsersAction) -> argparse._SubParsersAction:
    p = sub.add_parser("mtp", help="MTP draft heads: init, train, eval, study, diagnose, export")
    mtp_sub = p.add_subparsers(dest="mtp_command", required=True)
    init = mtp_sub.add_parser("init", help="add a freshly initialised MTP head to a model directory")
    init.add_argument("--model", required=True, help="the model directory (the head is added to it, or to --out)")
    init.add_argument("--out", help="write to this directory instead (the source is copied first)")
    init.add_argument("--num-layers", type=int, default=1, help="the head's transformer layers")
    init.add_argument("--intermediate-size", type=int, default=0,
                      help="the head's MLP width (0: the trunk's, the layout vLLM and SGLang load; narrower: a study "
                           "head)")
    init.add_argument("--seed", type=int, default=0, help="seeds the head's random weights")
    init.add_argument("--force", action="store_true", help="replace an existing head")
    init.set_defaults(func=run_init)
    _add_train(mtp_sub)
    _add_eval(mtp_sub)
    _add_study(mtp_sub)
    _add_diagnose(mtp_sub)
    _add_export(mtp_sub)
    return mtp_sub


def _add_export(mtp_sub) -> None:
    from bebop.model.engine_export import EXPORT_ENGINES

    p = mtp_sub.add_parser("export", help="write the model with its head as vLLM's or SGLang's MTP loader reads it")
    p.add_argument("--model", required=True, help="the model directory with its MTP head")
    p.add_argument("--engine", required=True, choices=EXPORT_ENGINES, help="the engine whose MTP loader reads the output")
    add_out_dir(p, "the model directory to write")
    p.add_argument("--k", type=int, default=3, help="drafts per step in the printed launch settings")
    p.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> None:
    from bebop.model.engine_export import export_head

    check_at_least_one(args, "k")
    print(export_head(args.model, engine=args.engine, out=args.out, k=args.k))


def _add_diagnose(mtp_sub) -> None:
    p = mtp_sub.add_parser("diagnose", help="the head's expected acceptance on rollouts another engine generated")
    p.add_argument("--model", required=True, help="the policy with its MTP head")
    p.add_argument("--rollouts", required=True, help="JSONL (or a JSON list): token ids as verl, vLLM, SGLang or "
                                                     "bebop dump them, or prompt/completion text")
    p.add_argument("--k", type=int, default=3, help="drafts per step for the per-depth numbers (1..8)")
    p.add_argument("--temperature", type=float, default=1.0, help="the target's temperature (the rollouts' sampling)")
    p.add_argument("--top-k", type=int, default=0, help="the target's top-k (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="the target's top-p (1.0 = off)")
    p.add_argument("--seed", type=int, default=0, help="seeds the RS chains' sampling")
    p.add_argument("--entropy-bins", type=int, default=10,
                   help="quantile bins of the target's entropy for the acceptance-vs-entropy law")
    p.add_argument("--batch-size", type=int, default=64, help="drafting positions per forward")
    p.add_argument("--baseline", help="a second rollout file (for example RL step 0's; --rollouts step N's): split the "
                                      "change in acceptance into its entropy part and the mismatch remainder")
    p.add_argument("--engine-metrics", help="the engine's own counters as JSON (vLLM's spec_decode_* or SGLang's "
                                            "accept_length), compared with the acceptance the head allows")
    add_out_dir(p, "directory for diagnosis.json and diagnosis.md (default: ROLLOUTS.diagnosis/)", required=False)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    add_progress_args(p)
    p.set_defaults(func=run_diagnose)


def run_diagnose(args: argparse.Namespace) -> None:
    from bebop.mtp.diagnose import MAX_REPORTED_K, check_k, diagnose
    from bebop.mtp.diagnose_report import write_diagnosis
    from bebop.mtp.engine_counters import compare, read_counters
    from bebop.mtp.rollout_files import read_rollouts
    from bebop.sampling import SamplingParams

    sampling = SamplingParams(args.temperature, args.top_k, args.top_p)
    check_k(args.k)
    check_at_least_one(args, "batch_size")
    counters = read_counters(args.engine_metrics) if args.engine_metrics else None
    k = max(args.k, min(MAX_REPORTED_K, len(counters.get("accepted_per_pos", [])))) if counters else args.k  # the engine's K too
    policy = load_policy(args.model, device=args.device)
    policy.model.require_mtp()
    pairs = read_rollouts(args.rollouts, policy)
    baseline = read_rollouts(args.baseline, policy) if args.baseline else None
    report = diagnose(policy, pairs, k=k, sampling=sampling, seed=args.seed, entropy_bins=args.entropy_bins,
                      batch_size=args.batch_size, baseline=baseline, progress=not args.no_progress)
    report |= {"model": str(args.model), "source": str(args.rollouts), "baseline": args.baseline}
    if counters:
        report["engine_metrics"] = compare(counters, report)
    out = Path(args.out) if args.out else Path(f"{args.rollouts}.diagnosis")
    for path in write_diagnosis(report, out):
        print(f"wrote {path}")
    print(json.dumps({key: report[key] for key in ("rs_acceptance_per_depth", "to_acceptance_per_depth",
                                                   "mean_acceptance_length")}))


def _add_study(mtp_sub) -> None:
    from bebop.study.loss_study import StudySpec

    d = StudySpec()
    p = mtp_sub.add_parser("study", help="train heads with each loss to convergence and compare their acceptance "
                                         "per temperature and head size (docs/results/loss-study.md)")
    p.add_argument("--model", required=True, help="the policy (its head, if any, is ignored)")
    p.add_argument("--task", default=d.task, help=f"whose prompts the heads are trained and measured on: {TASK_LIST}")
    add_out_dir(p, "the study's directory: heads, caches, loss_table.json (finished cells are reused)")
    p.add_argument("--losses", default=",".join(d.losses), help="comma-separated, ce among them (the reference)")
    p.add_argument("--temperatures", default=",".join(map(str, d.temperatures)),
                   help="comma-separated: each trains its heads on samples at that temperature and measures there")
    p.add_argument("--head-sizes", default=",".join(d.head_sizes),
                   help="comma-separated: full (the trunk's MLP width), half, quarter, or a width")
    p.add_argument("--seeds", default=",".join(map(str, d.seeds)), help="comma-separated; each trains one head "
                   "per loss and cell (paired differences to ce and 95%% t-intervals over seeds)")
    p.add_argument("--steps", type=int, default=d.steps, help="the step cap, the same for every loss")
    p.add_argument("--eval-every", type=int, default=d.eval_every, help="steps between held-out measures")
    p.add_argument("--patience", type=int, default=d.patience,
                   help="stop a head after this many held-out measures without improvement (0: train to the cap)")
    p.add_argument("--held-out", type=int, default=d.held_out, help="self-distilled samples held out")
    p.add_argument("--depths", type=int, default=d.depths, help="chain depths each head trains")
    p.add_argument("--k", type=int, default=d.k, help="drafts per step of the measures")
    p.add_argument("--n", type=int, default=d.n_eval, help="test prompts for the measures")
    p.add_argument("--num-samples", type=int, default=d.num_samples, help="self-distillation samples per temperature")
    p.add_argument("--ce-warmup", type=float, default=d.ce_warmup,
                   help="share of the cap the non-ce heads first train with ce (0 = from scratch)")
    p.add_argument("--no-sampled", action="store_true", help="the exact measure only (no speculative generation)")
    add_progress_args(p)
    p.set_defaults(func=run_study)


def _csv(text: str, cast, flag: str) -> tuple:
    try:
        return tuple(cast(x.strip()) for x in text.split(",") if x.strip())
    except ValueError:
        raise BebopError(f"{flag} must be a comma-separated list, got {text!r}") from None


def run_study(args: argparse.Namespace) -> None:
    from bebop.losses import DRAFT_LOSSES
    from bebop.study.loss_study import StudySpec, run_loss_study

    losses = _csv(args.losses, str, "--losses")
    unknown = [x for x in losses if x not in DRAFT_LOSSES]
    if unknown or not losses:
        raise BebopError(f"unknown loss(es) {list(unknown)}; choose from {', '.join(DRAFT_LOSSES)}")
    spec = StudySpec(task=args.task, losses=losses, temperatures=_csv(args.temperatures, float, "--temperatures"),
                     head_sizes=_csv(args.head_sizes, str, "--head-sizes"), seeds=_csv(args.seeds, int, "--seeds"),
                     steps=args.steps, depths=args.depths, k=args.k, num_samples=args.num_samples,
                     held_out=args.held_out, eval_every=args.eval_every, patience=args.patience,
                     ce_warmup=args.ce_warmup, n_eval=args.n, sampled=not args.no_sampled)
    for cell in run_loss_study(args.model, args.out, spec, progress=not args.no_progress)["cells"]:
        print(json.dumps(cell))


def _add_train(mtp_sub) -> None:
    from bebop.mtp.train_config import MTPTrainConfig

    p = mtp_sub.add_parser("train", help="train the MTP head on the policy's own samples (trunk frozen)")
    p.add_argument("--model", required=True, help="the policy with its MTP head (bebop mtp init adds one)")
    add_config_flags(p, MTPTrainConfig)
    add_out_dir(p, "write the trained model here (default: into --model)", required=False)
    p.add_argument("--resume", action="store_true", help="continue the run in OUT (--out, else --model)")
    add_log_args(p, run_dir="OUT (--out, else --model)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N (not part of the run: resume anywhere)")
    add_field_flags(p, DecodeSpec, only=("vllm_python", "vllm_timeout"))
    add_progress_args(p)
    add_learner_args(p, _check_train_ranks)
    p.set_defaults(func=run_train)


def _check_train_ranks(args: argparse.Namespace, nproc: int) -> None:
    from bebop.mtp.train_config import MTPTrainConfig

    World(0, nproc).check_divides(MTPTrainConfig(**config_values(MTPTrainConfig, args)).batch_size, "--batch-size")


def run_train(args: argparse.Namespace) -> None:
    from bebop.mtp.train import train_mtp
    from bebop.mtp.train_config import MTPTrainConfig

    cfg = MTPTrainConfig(**config_values(MTPTrainConfig, args))
    summary = train_mtp(args.model, cfg, out=args.out, resume=args.resume, progress=not args.no_progress,
                        loggers=args.log or (),
                        device=args.device, vllm=DecodeSpec(engine=cfg.engine, vllm_python=args.vllm_python,
                                                            vllm_timeout=args.vllm_timeout), parallel=args.parallel)
    if env_world().is_main:
        print(json.dumps(summary))


def _add_eval(mtp_sub) -> None:
    p = mtp_sub.add_parser("eval", help="acceptance under RS and TO at K, across temperatures")
    p.add_argument("--model", required=True, help="the policy with its MTP head")
    p.add_argument("--k", type=int, default=3, help="drafts per step (1..8)")
    p.add_argument("--temperatures", default="0.3,0.7,1.0", help="comma-separated")
    p.add_argument("--mode", choices=("rs", "to", "both"), default="both",
                   help="the acceptance rule: rejection sampling, target-only, or both")
    p.add_argument("--task", default="math", help=f"whose test problems are decoded: {TASK_LIST}")
    p.add_argument("--n", type=int, default=64, help="test problems per point")
    p.add_argument("--seed", type=int, default=0, help="seeds the test problems and the sampling")
    p.add_argument("--max-new-tokens", type=int, default=192, help="per completion")
    p.add_argument("--diagnostics", type=int, default=0, metavar="N",
                   help="also the draft-vs-target diagnostics per depth (KL, entropy gap, acceptance split) on N "
                        "of the policy's own test completions per temperature (0 = off)")
    p.add_argument("--entropy-bins", type=int, default=0,
                   help="also report acceptance per depth in N quantile bins of the target's entropy, with 95%% "
                        "intervals, and the first draft's acceptance slope per nat (0 = off)")
    add_progress_args(p)
    p.set_defaults(func=run_eval)


def run_eval(args: argparse.Namespace) -> None:
    from bebop.mtp.evaluate import evaluate_mtp
    from bebop.tasks import get_task

    try:
        temperatures = [float(t) for t in args.temperatures.split(",") if t.strip()]
    except ValueError:
        raise BebopError(f"--temperatures must be comma-separated numbers, got {args.temperatures!r}") from None
    if not temperatures or any(t < 0 for t in temperatures):
        raise BebopError(f"--temperatures must be >= 0, got {args.temperatures!r}")
    modes = ["rs", "to"] if args.mode == "both" else [args.mode]
    policy = load_policy(args.model)
    for row in evaluate_mtp(policy, get_task(args.task), k=args.k, temperatures=temperatures, modes=modes,
                            n=args.n, seed=args.seed, max_new_tokens=args.max_new_tokens, entropy_bins=args.entropy_bins,
                            progress=not args.no_progress):
        print(json.dumps(row), flush=True)
    if args.diagnostics:
        _print_diagnostics(policy, get_task(args.task), temperatures, args)


def _print_diagnostics(policy, task, temperatures: list[float], args: argparse.Namespace) -> None:
    from bebop.mtp.data import sample_sequences
    from bebop.mtp.diagnostics import draft_diagnostics

    for t in temperatures:
        if not t > 0:
            continue  # a greedy target has no distribution to compare
        seqs = sample_sequences(policy, task, n=args.diagnostics, temperature=t, seed=args.seed, split="test",
                                max_new_tokens=args.max_new_tokens, progress=not args.no_progress)
        for row in draft_diagnostics(policy, seqs, depths=args.k, temperature=t):
            print(json.dumps({"diagnostics": True, "temperature": t, **row}), flush=True)


def run_init(args: argparse.Namespace) -> None:
    src = Path(args.model)
    policy = load_policy(src, device="cpu")
    if policy.model.mtp is not None:
        refuse_to_replace(f"{src} already has an MTP head", args.force)
    dst = Path(args.out) if args.out else src
    if dst != src:
        if dst.exists():
            raise BebopError(f"--out {dst} already exists")
        shutil.copytree(src, dst)
    policy.model.attach_mtp(args.num_layers, torch.Generator().manual_seed(args.seed),
                            intermediate_size=args.intermediate_size)
    save_model(policy.model, dst)
    n = sum(int(p.numel()) for p in policy.model.head_parameters())
    print(f"added an MTP head ({args.num_layers} layer(s), {n / 1e6:.2f}M parameters) to {dst}")
