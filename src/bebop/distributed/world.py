"""The ranks of a run: who this process is, its device, and the few collectives the learner needs.

    world = init_world("auto")       # from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK); 1 rank without
    world.share(range(32))           # this rank's items: items[rank::size] (equal shares: check_divides first)
    world.sum([loss, tokens])        # summed over ranks (a float list)
    world.gather_rows(mine)          # every rank's share of a batch's rows, the whole batch on every rank
    world.broadcast(obj)             # rank 0's object on every rank

One process (no torchrun environment) is a world of one: every call is the identity, nothing is imported
from torch.distributed, and the run is exactly what it was before the learner could span ranks.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from bebop.errors import BebopError

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def share(self, items: Sequence[T]) -> list[T]:
        """This rank's items, interleaved (items[rank::size]): sorted inputs give every rank the same mix."""
        return list(items[self.rank:: self.size])

    def check_divides(self, count: int, what: str) -> None:
        if count % self.size:
            raise BebopError(f"{what} ({count}) must be divisible by the number of ranks ({self.size}): "
                             "every rank takes an equal share of every batch")

    def sum(self, values: Sequence[float]) -> list[float]:
        if not self.distributed:
            return list(values)
        import torch.distributed as dist

        t = torch.tensor(list(values), dtype=torch.float64)
        dist.all_reduce(t)
        return t.tolist()

    def gather(self, value: float) -> list[float]:
        """Every rank's `value`, in rank order, on every rank."""
        slots = [0.0] * self.size
        slots[self.rank] = value
        return self.sum(slots)

    def gather_rows(self, mine: torch.Tensor) -> torch.Tensor:
        """The whole batch from every rank's share: mine (n, ...) = this rank's rows (rows[rank::size], as `share`
        takes them) -> (n * size, ...) in the batch's order, on every rank."""
        if not self.distributed:
            return mine
        import torch.distributed as dist

        parts = [torch.empty_like(mine) for _ in range(self.size)]
        dist.all_gather(parts, mine.contiguous())
        return torch.stack(parts, dim=1).flatten(0, 1)  # row i of rank r is the batch's row i * size + r

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank (pickled: small things, a batch of rollouts)."""
        if not self.distributed:
            return obj
        import torch.distributed as dist

        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()


def peak_memory_mb(device: str | torch.device) -> float:
    """This process's peak memory so far: the GPU's allocated peak on CUDA, else the peak resident set (Linux and
    macOS report ru_maxrss in KiB and bytes)."""
    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def env_world() -> World:
    """The world torchrun (or launch.py) describes in the environment; one rank without it."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    return World(int(os.environ.get("RANK", "0")), size, int(os.environ.get("LOCAL_RANK", "0")))


def rank_device(world: World, device: str) -> str:
    """The rank's device: `cuda` (or auto with a GPU) -> cuda:LOCAL_RANK; cpu stays cpu."""
    if device in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{world.local_rank}"
    if device.startswith("cuda:") and world.distributed:
        raise BebopError(f"--device {device} names one GPU, but a run with {world.size} ranks puts rank r on cuda:r; "
                         "pass --device cuda (or auto)")
    return "cpu" if device == "auto" else device


def init_world(device: str = "auto") -> tuple[World, str]:
    """Join the process group torchrun set up (gloo on the CPU, NCCL on GPUs) -> (world, this rank's device).

    Each CPU rank takes its share of the cores (torch's threads per process)."""
    world = env_world()
    dev = rank_device(world, device)
    if world.distributed:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("nccl" if dev.startswith("cuda") else "gloo")
            if dev.startswith("cuda"):
                torch.cuda.set_device(dev)
        if dev == "cpu" and "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world.size))
    return world, dev
