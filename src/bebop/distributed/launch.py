"""`--nproc N`: the same command as N ranks on this machine, through torch's elastic launcher (the engine
behind `torchrun --standalone --nproc-per-node N`).

    code = relaunch(4, ["sft", "--task", "math", "--out", "runs/p", "--nproc", "4"])   # in the parent

The parent checks the request first (`check_nproc`: no more ranks than the machine has CPU cores or GPUs),
starts the ranks, waits, and turns a rank that died into one line naming it; what the run saved last is
intact (every save is atomic), so `--resume` continues from it. Under torchrun (WORLD_SIZE set) nothing is
relaunched: the command runs as the rank it is.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import uuid
from collections.abc import Sequence
from typing import Any, NoReturn

import torch

from bebop.distributed.world import env_world
from bebop.errors import BebopError


def under_launcher() -> bool:
    return "WORLD_SIZE" in os.environ


def exit_rank(code: int) -> NoReturn:
    """End a rank's process once its command returned: the process group destroyed, the output flushed, then
    os._exit. The interpreter's own teardown of torch's distributed state could abort a rank whose run had
    finished and saved ("terminate called without an active exception", exit by SIGABRT), which the launcher
    reports as a failed run; every file a run writes is written and closed before its command returns."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def machine_ranks(device: str) -> tuple[int, str]:
    """How many ranks this machine can run for `device`, and of what."""
    if device != "cpu" and torch.cuda.is_available():
        return torch.cuda.device_count(), "GPUs"
    return os.cpu_count() or 1, "CPU cores"


def check_nproc(nproc: int, device: str) -> None:
    if nproc < 1:
        raise BebopError(f"--nproc must be >= 1, got {nproc}")
    if under_launcher():
        world = env_world()
        if nproc > 1 and nproc != world.size:
            raise BebopError(f"--nproc {nproc} disagrees with the launcher's world of {world.size} ranks")
        return
    have, what = machine_ranks(device)
    if nproc > have:
        raise BebopError(f"--nproc {nproc} asks for more ranks than this machine can run ({have} {what})")


def relaunch(nproc: int, argv: Sequence[str]) -> int:
    """Run `python -m bebop ARGV` as `nproc` ranks; -> the exit code (2 when a rank refused its input)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.5)
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)  # a failure is reported in one line
    threads = os.environ.get("OMP_NUM_THREADS")  # each rank takes its share of the cores
    os.environ["OMP_NUM_THREADS"] = threads or str(max(1, (os.cpu_count() or 1) // nproc))
    try:
        elastic_launch(config, entrypoint=sys.executable)("-m", "bebop", *argv)
    except ChildFailedError as exc:
        rank, failure = _cause(exc.failures)
        if failure.exitcode == 2:  # a BebopError: the rank printed its one line
            return 2
        print(f"error: rank {rank} of {nproc} stopped ({_how(failure.exitcode)}); the run stopped with it. Its "
              "last save is intact: rerun with --resume to continue", file=sys.stderr)
        return 1
    finally:
        if threads is None:
            del os.environ["OMP_NUM_THREADS"]
    return 0


def _cause(failures: dict) -> tuple[int, Any]:
    """The failure that stopped the run: a rank that refused its input (exit code 2), else one killed by a signal
    from outside (the others then fail on their broken connections, often within the same poll of the launcher,
    and the launcher SIGTERMs whoever is left), else one that failed, else the earliest; ties by rank."""
    def order(item):
        rank, failure = item
        code = failure.exitcode
        kind = 0 if code == 2 else 1 if code < 0 and code != -signal.SIGTERM else 2 if code > 0 else 3
        return (kind, failure.timestamp, rank)

    return min(failures.items(), key=order)


def _how(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"
