"""Peak memory per learner rank: one process against 2 ranks with FSDP2 and with DDP (issue 28).

    python benchmarks/learner_memory.py [--command sft|mtp] [--steps 4] [--hidden 512] [--layers 8] [--vocab 32768]
                                        [--micro-batch-size 4]

Builds a model larger than the embedded default (hidden 512, 8 layers, a 32k vocabulary by default: about 30M
parameters with the embedding tied to the LM head), then trains it for --steps steps with `bebop sft` (every
parameter trained) or `bebop mtp train` (the trunk frozen, the head trained) as 1 process, 2 ranks
`--parallel fsdp` and 2 ranks `--parallel ddp`, the same batches in each. Each rank reports its own peak memory
(the resident set's peak on the CPU, the allocator's on a GPU: bebop.distributed.world.peak_memory_mb) and the run
its training seconds, and what it holds of the training state (weights, gradients, AdamW moments: exact tensor
bytes, bebop.distributed.parallel.Parallel.state_mb). Prints one JSON line per run and a markdown table.

What bounds the numbers: a CPU rank's peak resident set counts everything the process ever held (torch itself,
about 300 MB, the data, the gathered checkpoint on rank 0), not only parameters, gradients and AdamW state.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bebop.embedded import build_char_tokenizer, codec_from_tokenizer, default_config, save_tokenizer
from bebop.model.checkpoint import build_model, save_model

from common import machine

RUNS = (("1 process", 1, "fsdp"), ("2 ranks fsdp", 2, "fsdp"), ("2 ranks ddp", 2, "ddp"))


def build(tmp: Path, args: argparse.Namespace) -> Path:
    model = tmp / "model"
    tok = build_char_tokenizer()  # the embedded default's tokenizer; the vocabulary padded to --vocab rows
    codec = codec_from_tokenizer(tok)
    cfg = default_config(args.vocab, codec.eos_id, codec.pad_id, hidden_size=args.hidden,
                         intermediate_size=3 * args.hidden, num_hidden_layers=args.layers, num_attention_heads=8,
                         num_key_value_heads=4, head_dim=args.hidden // 8, max_position_embeddings=512)
    save_model(build_model(cfg, seed=0), model)
    save_tokenizer(tok, model)
    if args.command == "mtp":
        bebop(["mtp", "init", "--model", str(model)])
    return model


def bebop(argv: list[str]) -> str:
    done = subprocess.run([sys.executable, "-m", "bebop", *argv], capture_output=True, text=True,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if done.returncode:
        raise SystemExit(f"bebop {' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def train(model: Path, out: Path, nproc: int, parallel: str, args: argparse.Namespace) -> dict:
    common = ["--steps", str(args.steps), "--batch-size", "8", "--device", "cpu", "--nproc", str(nproc),
              "--parallel", parallel, "--save-every", str(args.steps)]
    if args.command == "sft":
        argv = ["sft", "--model", str(model), "--task", "math", "--out", str(out),
                "--micro-batch-size", str(args.micro_batch_size), "--warmup", "1", *common]
    else:
        argv = ["mtp", "train", "--model", str(model), "--out", str(out), "--task", "math", "--num-samples", "16",
                "--max-new-tokens", "64", "--depths", "3", *common]
    return json.loads(bebop(argv).strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--command", choices=("sft", "mtp"), default="sft")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--micro-batch-size", type=int, default=4, help="sft: rows per forward (1: the state dominates)")
    args = p.parse_args()
    print(f"# {machine()}", file=sys.stderr)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = build(Path(tmp), args)
        if args.command == "mtp":  # the self-distillation samples, cached in the model directory before any run
            train(model, Path(tmp) / "warm-up", 1, "fsdp", argparse.Namespace(**{**vars(args), "steps": 1}))
        for name, nproc, parallel in RUNS:
            result = train(model, Path(tmp) / name.replace(" ", "-"), nproc, parallel, args)
            row = {"run": name, "command": args.command, "peak_memory_mb": result["peak_memory_mb"],
                   "state_mb": result["state_mb"],
                   "train_seconds": result["train_seconds_this_run"], "learner": result["learner"]}
            print(json.dumps(row), flush=True)
            rows.append(row)
    print(f"\n| {args.command}, hidden {args.hidden}, {args.layers} layers, V {args.vocab}, micro-batch "
          f"{args.micro_batch_size} | peak MB per rank | training state MB per rank | "
          "train s |\n|---|---|---|---|")
    for row in rows:
        peaks = " / ".join(f"{m:.0f}" for m in row["peak_memory_mb"])
        state = " / ".join(f"{m:.0f}" for m in row["state_mb"])
        print(f"| {row['run']} | {peaks} | {state} | {row['train_seconds']} |")


if __name__ == "__main__":
    main()
