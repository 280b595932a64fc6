"""`bebop demo`: the main job on the embedded default.

For now: build (or reuse) the embedded default model and generate from it. Later issues grow
this into the full study (train the policy, train MTP heads, sweep, RL, report).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from bebop.embedded import init_model_dir
from bebop.engine import generate
from bebop.policy import load_policy
from bebop.sampling import SamplingParams


def run_demo(args: argparse.Namespace) -> None:
    out = Path(args.out)
    model_dir = out / "policy"
    if not (model_dir / "config.json").is_file():
        print(f"building the embedded default model in {model_dir}")
        init_model_dir(model_dir, seed=args.seed)
    policy = load_policy(model_dir)
    n_params = sum(p.numel() for p in policy.model.parameters())
    print(f"model: {model_dir} ({n_params / 1e6:.2f}M parameters, vocab {policy.model.config.vocab_size})")
    prompts = ["Q: 3 + 4 = ?\nA:", "Hello"]
    gens = generate(policy.model, [policy.codec.encode(p) for p in prompts], max_new_tokens=32,
                    sampling=SamplingParams(1.0), stop_ids=policy.stop_ids,
                    generator=torch.Generator().manual_seed(args.seed), pad_id=policy.pad_id)
    for prompt, gen in zip(prompts, gens):
        print(json.dumps({"prompt": prompt, "completion": policy.codec.decode(gen.token_ids),
                          "finish_reason": gen.finish_reason}))
