"""`bebop rl`: GRPO with rollouts from the (speculative) engine, sync or async, with online MTP."""

from __future__ import annotations

import argparse
import json

from bebop.commands.flags import add_spec_args
from bebop.engine.speculative import parse_k
from bebop.rl.config import BACKENDS, MODES, MTP_UPDATES, Backend, RLConfig


def add_parser(sub: argparse._SubParsersAction) -> None:
    d = RLConfig()
    p = sub.add_parser("rl", help="GRPO post-training with speculative rollouts (sync or async)")
    p.add_argument("--model", required=True, help="starting policy directory (with an MTP head for --spec)")
    p.add_argument("--task", required=True, help="math, code, agent or mix")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True, help="run directory: config.json, metrics.jsonl, checkpoints, model/")
    p.add_argument("--mode", choices=MODES, default=None,
                   help=f"default: {d.mode} with --backend local, async with --backend ray")
    add_spec_args(p, spec=d.spec, k=d.k)
    p.add_argument("--mtp-update", choices=MTP_UPDATES, default=d.mtp_update, help="online MTP strategy")
    p.add_argument("--group-size", type=int, default=d.group_size, help="G: samples per prompt (>= 2)")
    p.add_argument("--batch-prompts", type=int, default=d.batch_prompts, help="prompts per step")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    p.add_argument("--temperature", type=float, default=d.temperature)
    p.add_argument("--top-k", type=int, default=d.top_k, help="0 = off; the trainer's log-probs use the same warping")
    p.add_argument("--top-p", type=float, default=d.top_p, help="1.0 = off; the trainer's log-probs use the same warping")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--mtp-lr", type=float, default=d.mtp_lr)
    p.add_argument("--kl-coef", type=float, default=d.kl_coef, help="k3 KL to the starting policy (0 = off)")
    p.add_argument("--clip-eps", type=float, default=d.clip_eps)
    p.add_argument("--ppo-epochs", type=int, default=d.ppo_epochs,
                   help="passes over each batch (> 1, or --mini-batches > 1, lets --clip-eps act)")
    p.add_argument("--mini-batches", type=int, default=d.mini_batches,
                   help="optimizer steps per pass, each on a random share of the batch's rollouts")
    p.add_argument("--max-staleness", type=int, default=d.max_staleness, help="async: drop older rollouts")
    p.add_argument("--difficulty", type=int, default=d.difficulty)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--save-every", type=int, default=d.save_every)
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--rollout-threads", type=int, default=d.rollout_threads,
                   help="async: torch threads of the rollout worker (0 = torch's default)")
    p.add_argument("--train-threads", type=int, default=d.train_threads,
                   help="async: torch threads of the trainer (0 = torch's default)")
    p.add_argument("--tensorboard", action="store_true", help="also log to OUT/tb (needs tensorboard)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--backend", choices=BACKENDS, default="local",
                   help="where rollouts run: this process, or Ray actors (pip install 'bebop[ray]')")
    p.add_argument("--rollout-workers", type=int, default=1, help="ray: rollout actors (<= max-staleness + 1)")
    p.add_argument("--ray-address", default=None,
                   help="ray: join this cluster (auto, HOST:PORT, ray://HOST:PORT); default: start a local Ray")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    from bebop.rl.loop import train_rl

    mode = args.mode or ("async" if args.backend == "ray" else RLConfig().mode)
    cfg = RLConfig(model=args.model, task=args.task, steps=args.steps, mode=mode, spec=args.spec,
                   k=parse_k(args.k), max_k=args.max_k, mtp_update=args.mtp_update,
                   group_size=args.group_size, batch_prompts=args.batch_prompts,
                   max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                   ppo_epochs=args.ppo_epochs, mini_batches=args.mini_batches, lr=args.lr, mtp_lr=args.mtp_lr,
                   kl_coef=args.kl_coef, clip_eps=args.clip_eps, max_staleness=args.max_staleness,
                   difficulty=args.difficulty, seed=args.seed, save_every=args.save_every,
                   rollout_threads=args.rollout_threads, train_threads=args.train_threads)
    summary = train_rl(args.out, cfg, resume=args.resume, progress=not args.no_progress,
                       tensorboard=args.tensorboard, device=args.device,
                       backend=Backend(args.backend, args.rollout_workers, args.ray_address))
    print(json.dumps(summary))
