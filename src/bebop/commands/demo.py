"""`bebop demo`: the main job on the embedded default.

Today it (1) trains the small math policy from scratch, or reuses it when `OUT/policy` already
holds a finished run, (2) reports its pass rate and mean next-token entropy at temperature 1 on
held-out problems, and (3) shows a few sampled solutions. Later issues grow this into the full
study (MTP heads, acceptance against entropy, RL speedup, report).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from bebop.policy import load_policy
from bebop.rollout import run_episodes, summarize
from bebop.sampling import SamplingParams
from bebop.sft import SFTConfig, is_trained, train_sft
from bebop.tasks import get_task

DEMO_TASK = "math"


def ensure_policy(out: Path, seed: int, task: str = DEMO_TASK) -> Path:
    """Train the demo policy unless a finished one is already there (resume a killed run)."""
    model_dir = out / "policy"
    if is_trained(model_dir):
        print(f"reusing the trained policy in {model_dir}")
        return model_dir
    resume = (model_dir / "train_state.pt").is_file()
    print(f"{'resuming' if resume else 'training'} the {task} policy in {model_dir} (about 10 minutes on 2 CPU cores)")
    train_sft(model_dir, SFTConfig(task=task, seed=seed), resume=resume)
    return model_dir


def run_demo(args: argparse.Namespace) -> None:
    out = Path(args.out)
    model_dir = ensure_policy(out, args.seed)
    policy = load_policy(model_dir)
    task = get_task(DEMO_TASK)
    problems = task.problems("test", 200, args.seed)
    episodes = run_episodes(policy, task, problems, sampling=SamplingParams(1.0), max_new_tokens=192,
                            generator=torch.Generator().manual_seed(args.seed), batch_size=100)
    summary = summarize(episodes)
    print(json.dumps({"task": DEMO_TASK, "temperature": 1.0, **summary}))
    for ep in episodes[:3]:
        print(f"--- reward {ep.reward:.0f}\n{ep.problem.prompt}{ep.completion}")
