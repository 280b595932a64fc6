"""Data-parallel training on PyTorch's own engines: FSDP2 (`fully_shard`) or DDP, one process per rank.

    par = Parallel(world, "fsdp", model, Logits(model))   # wraps; build the optimizer on par's parameters after
    for last, chunk in par.chunks(chunks):                   # DDP all-reduces after the last; FSDP2 after each
        (par.forward(ids) ... * par.loss_scale).backward()
    norm = par.clip_grad_norm(params, 1.0)
    full = par.full_model()     # rank 0: the whole model (saves, rollouts, evaluation); None elsewhere

A step with N ranks is the step of one process on the whole batch: every rank scales its share's loss by
N (the engines average gradients over ranks) after dividing by the whole batch's token count, so the
reduced gradient is the token-weighted mean of one process (float-summation order aside).

FSDP2 shards every decoder layer and the rest (embeddings, final norm, LM head, the head) at the root:
parameters, gradients and AdamW state live 1/N per rank, each layer gathered for its forward and backward.
DDP keeps a replica per rank and all-reduces the gradients. A world of one wraps nothing.

Checkpoints are the one-process format on every world size: the model's full state and the optimizer's
state keyed by parameter index (torch.optim's own layout), gathered to rank 0 with
torch.distributed.checkpoint's state-dict helpers, so a run saved with N ranks resumes with M.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import torch
from torch import nn

from bebop.distributed.world import World
from bebop.errors import BebopError
from bebop.model.packing import Packing
from bebop.model.qwen3 import CausalLM

PARALLEL = ("fsdp", "ddp")
T = TypeVar("T")


class Logits(nn.Module):
    """The training forward of sft and the RL update as one module (what DDP and FSDP2 wrap): ids (B, T) ->
    logits (B, T, V) float32; with a packing (model/packing.py), its (1, N) ids -> the logits of its outputs
    (M, V), each row's predictions."""

    def __init__(self, model: CausalLM) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, packing: Packing | None = None) -> torch.Tensor:
        hidden = self.model(ids, packing=packing)  # (B, T, H)
        return self.model.logits(hidden if packing is None else hidden[0, packing.outputs])


def check_parallel(mode: str) -> None:
    if mode not in PARALLEL:
        raise BebopError(f"unknown --parallel {mode!r}; choose from {', '.join(PARALLEL)}")


class Parallel:
    def __init__(self, world: World, mode: str, model: CausalLM, forward: nn.Module) -> None:
        check_parallel(mode)
        self.world, self.model = world, model
        self.mode = mode if world.distributed else "none"
        self.forward: nn.Module = _wrap(self.mode, model, forward)
        self._full: CausalLM | None = None  # rank 0's gathered copy (FSDP)

    @property
    def loss_scale(self) -> float:
        """What each rank's whole-batch-normalised loss is multiplied by: the engines average over ranks."""
        return float(self.world.size)

    def describe(self) -> dict:
        return {"world_size": self.world.size, "parallel": self.mode}

    def chunks(self, items: Sequence[T]) -> Iterator[tuple[bool, T]]:
        """Each micro-batch with `last`. DDP all-reduces only after the last one's backward (a replica holds whole
        gradients anyway); FSDP2 reduce-scatters after every one, so that no rank ever holds more than one
        layer's unsharded gradient (skipping the sync would keep every layer's until the last micro-batch)."""
        for i, item in enumerate(items):
            last = i == len(items) - 1
            with self.forward.no_sync() if self.mode == "ddp" and not last else contextlib.nullcontext():  # type: ignore[operator]
                yield last, item

    def state_mb(self, optimizer: torch.optim.Optimizer) -> float:
        """What this rank holds of the training state, in MB: its parameters (a shard under FSDP), their gradients
        and the optimizer's state tensors."""
        tensors = [t for p in self.forward.parameters() for t in (p, p.grad) if t is not None]
        tensors += [t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)]
        return sum(_local(t).numel() * t.element_size() for t in tensors) / 2**20

    def clip_grad_norm(self, params: Sequence[nn.Parameter], max_norm: float) -> float:
        """The global pre-clip gradient norm (over every rank's shards), after clipping to `max_norm`."""
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        full = getattr(norm, "full_tensor", None)  # a DTensor under FSDP2
        return float(full() if full is not None else norm)

    def full_model(self) -> CausalLM | None:
        """Rank 0: the whole model at the current weights (the model itself, or under FSDP a copy refreshed from
        the gathered shards); None on other ranks. Every rank must call it (FSDP gathers)."""
        if self.mode != "fsdp":
            return self.model if self.world.is_main else None
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state: Any = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.world.is_main:
            return None
        if self._full is None:  # on the rank's device: rank 0 samples with it
            self._full = CausalLM.from_state_dict(self.model.config, state).to(self.model.device)
            self._full.stored = self.model.stored
        else:
            self._full.load_state_dict(state)
        return self._full

    def load_full_state(self, state: dict[str, Any], *, strict: bool = True) -> None:
        """Every rank passes the full state (read from the same file); each keeps its shard."""
        if self.mode != "fsdp":
            self.model.load_state_dict(state, strict=strict)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(self.model, dict(state), options=StateDictOptions(full_state_dict=True, strict=strict))

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict | None:
        """The optimizer's state in one process's layout (keyed by parameter index), on rank 0."""
        if self.mode != "fsdp":
            return optimizer.state_dict() if self.world.is_main else None
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        state = get_optimizer_state_dict(self.forward, optimizer,
                                         options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return _by_index(state) if self.world.is_main else None

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """Every rank passes the one-process state (from the same file)."""
        if self.mode != "fsdp":
            optimizer.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        names = _param_names(self.forward, optimizer)
        set_optimizer_state_dict(self.forward, optimizer, _by_name(state, names),
                                 options=StateDictOptions(full_state_dict=True))


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)  # a DTensor: this rank's shard
    return to_local() if to_local is not None else t


def _wrap(mode: str, model: CausalLM, forward: nn.Module) -> nn.Module:
    if mode == "none":
        return forward
    if mode == "ddp":
        device = model.device
        return nn.parallel.DistributedDataParallel(forward, device_ids=[device] if device.type == "cuda" else None)
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(forward)
    return forward


def _param_names(module: nn.Module, optimizer: torch.optim.Optimizer) -> list[list[str]]:
    """The name of every optimizer parameter, per group, in the optimizer's order."""
    names = {id(p): n for n, p in module.named_parameters()}
    return [[names[id(p)] for p in group["params"]] for group in optimizer.param_groups]


def _by_index(state: dict[str, Any]) -> dict[str, Any]:
    """A name-keyed optimizer state (torch.distributed.checkpoint's) -> torch.optim's index-keyed one."""
    index: dict[str, int] = {}
    groups = []
    for group in state["param_groups"]:
        ids = [index.setdefault(name, len(index)) for name in group["params"]]
        groups.append({**group, "params": ids})
    return {"state": {index[n]: s for n, s in state["state"].items()}, "param_groups": groups}


def _by_name(state: dict[str, Any], names: list[list[str]]) -> dict[str, Any]:
    flat = [n for group in names for n in group]
    if len(state["param_groups"]) != len(names) or any(
            len(g["params"]) != len(n) for g, n in zip(state["param_groups"], names, strict=True)):
        raise BebopError("the saved optimizer state does not match this model's parameters (another model or "
                         "a changed run)")
    groups = [{**g, "params": n} for g, n in zip(state["param_groups"], names, strict=True)]
    return {"state": {flat[int(i)]: s for i, s in state["state"].items()}, "param_groups": groups}
