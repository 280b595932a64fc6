"""Flags that several commands share: sampling, speculation, device."""

from __future__ import annotations

import argparse

from bebop.chat import TEMPLATE_KWARGS_HELP
from bebop.commands.config_flags import add_field_flags, fields_from_args
from bebop.decoding import DecodeSpec
from bebop.errors import BebopError
from bebop.loggers import LOGGERS


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")


def add_chat_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chat-template-kwargs", default="", help=TEMPLATE_KWARGS_HELP)


def add_learner_args(p: argparse.ArgumentParser, check) -> None:
    """--nproc and --parallel: the learner over N ranks (bebop.distributed). `check(args, nproc)` refuses a request the
    ranks could not run (a batch N does not divide) before any rank starts."""
    from bebop.distributed.parallel import PARALLEL

    p.add_argument("--nproc", type=int, default=1,
                   help="learner ranks on this machine (torch.distributed: gloo on the CPU, NCCL on GPUs; each rank "
                        "takes its share of every batch); or launch with torchrun --nproc-per-node N -m bebop ...")
    p.add_argument("--parallel", choices=PARALLEL, default="fsdp",
                   help="with several ranks: fsdp shards parameters, gradients and AdamW state (FSDP2 fully_shard); "
                        "ddp keeps a replica per rank (DistributedDataParallel)")
    p.set_defaults(learner_check=check)


def add_progress_args(p: argparse.ArgumentParser) -> None:
    """--no-progress: the command's progress bars (bebop.progress) print nothing."""
    from bebop.progress import INTERVAL_S

    p.add_argument("--no-progress", action="store_true",
                   help=f"print no progress on stderr (else a bar on a terminal, or a line every {INTERVAL_S:g} s "
                        "in a file or a pipe)")


def add_log_args(p: argparse.ArgumentParser, run_dir: str = "OUT") -> None:
    """--log TRACKER (repeatable) beside the JSONL log; --tensorboard is --log tensorboard."""
    p.add_argument("--log", action="append", choices=LOGGERS, default=None,
                   help=f"also log every step's metrics to TensorBoard ({run_dir}/tb), Weights & Biases "
                        f"(WANDB_PROJECT, WANDB_MODE=offline) or MLflow (MLFLOW_TRACKING_URI, else {run_dir}/mlruns); "
                        "repeatable; each needs its package (pip install 'bebop[wandb]')")
    p.add_argument("--tensorboard", dest="log", action="append_const", const="tensorboard",
                   help="the same as --log tensorboard")


def check_at_least_one(args: argparse.Namespace, *names: str) -> None:
    """Each flag `names` (attribute names) is >= 1, else the error names it."""
    for name in names:
        if getattr(args, name) < 1:
            raise BebopError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")


def add_device_args(p: argparse.ArgumentParser) -> None:
    """The decoding engine's device and dtype, and the decoding flags (generate, eval)."""
    p.add_argument("--dtype", "--rollout-dtype", dest="dtype", choices=("float32", "bfloat16"), default="float32",
                   help="the model's dtype for decoding (--rollout-dtype: the same flag under rl's name)")
    p.add_argument("--state-dtype", choices=("float32", "bfloat16"), default="float32",
                   help="what a hybrid model's caches keep its linear layers' recurrent states in (bfloat16: half the "
                        "memory traffic a decode step makes, as vLLM keeps them by default; the rule computes in "
                        "float32 either way)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    add_field_flags(p, DecodeSpec)  # --engine, --spec, --k, --max-k, --compile, --vllm-python


def decode_spec(args: argparse.Namespace) -> DecodeSpec:
    """The decoding flags as one checked DecodeSpec."""
    return fields_from_args(DecodeSpec, args)
