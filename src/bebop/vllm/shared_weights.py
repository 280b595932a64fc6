"""The weights a vLLM worker serves, kept in one shared-memory file that vLLM maps: a sync writes only what changed.

    shared = SharedWeights(model, dtype=torch.bfloat16, drafts=True)   # the layout; what vLLM loaded at its start
    update = shared.update(model)   # the tensors that changed since the last write, written; what vLLM is to load
    update = shared.everything()    # what a freshly started worker loads to serve the last write
    shared.close()                  # the file removed

Every tensor vLLM serves (the model's tensors under its files' names: bebop.model.checkpoint.file_tensors) has a
fixed slot in the file, in the serving dtype, written from the model with one copy (cast on the way; from a GPU,
one device-to-host copy). A sync compares each group of tensors with the last write by the tensors' storage and
version counters (an optimizer step, `load_state_dict` and any in-place change move them): the trunk after an RL
update, the MTP head after an online head update, both, or neither. An update names what vLLM loads: the
target's changed tensors, and for the drafter (vLLM keeps an MTP head as a model of its own) the head's tensors
when the head changed plus the embedding and LM head it shares with the trunk when the trunk changed. The worker
(shim/bebop_weight_transfer.py) loads them from views of the file, inside vLLM's weight-update sessions; nothing
is written to disk after the first load. The file, the served weights' bytes, is made at the first update (a
generate or eval run, which never syncs, makes none) in /dev/shm where it has room (a container's is often 64 MB),
else in the temporary folder (a mapped file there still spares the copies a safetensors write and reread cost).
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from bebop.model.checkpoint import file_tensors
from bebop.model.mtp import MTP_PREFIX
from bebop.model.qwen3 import CausalLM

ALIGN = 64  # bytes: every slot starts aligned for any dtype's view
SHARED_WITH_DRAFTER = ("embed_tokens.", "lm_head.")  # trunk tensors an MTP drafter reads (it shares them in vLLM)


SHM = "/dev/shm"
ROOM_MARGIN = 1.25  # /dev/shm must hold the file with this much to spare


def shared_memory_root(nbytes: int) -> str:
    """/dev/shm where it exists with room for `nbytes` (Linux: memory, not disk), else the temporary folder."""
    if os.path.isdir(SHM) and os.access(SHM, os.W_OK):
        stat = os.statvfs(SHM)
        if stat.f_bavail * stat.f_frsize >= nbytes * ROOM_MARGIN:
            return SHM
    return tempfile.gettempdir()


@dataclass(frozen=True)
class Slot:
    offset: int
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def _signature(tensors: list[torch.Tensor]) -> tuple:
    """What changes when a tensor's values may have: its storage and its version counter (None: never compared
    equal, for a tensor without one, made under inference_mode)."""
    out: list[tuple[int, int] | None] = []
    for t in tensors:
        try:
            out.append((t.data_ptr(), t._version))
        except RuntimeError:
            out.append(None)
    return tuple(out)


class SharedWeights:
    def __init__(self, model: CausalLM, *, dtype: torch.dtype | None = None, drafts: bool = False) -> None:
        """`dtype`: the serving dtype (None: each tensor's own); `drafts`: vLLM drafts with the model's head (its
        mtp.* tensors are served, and updates name the drafter's tensors)."""
        self.drafts = drafts and model.mtp is not None
        tensors = file_tensors(model, with_head=self.drafts)
        self.slots: dict[str, Slot] = {}
        offset = 0
        for name, t in tensors.items():
            self.slots[name] = Slot(offset, tuple(t.shape), dtype if dtype is not None and t.is_floating_point()
                                    else t.dtype)
            offset += -(-self.slots[name].nbytes // ALIGN) * ALIGN
        self.nbytes = max(offset, 1)
        self.directory = Path(tempfile.mkdtemp(prefix=".bebop-vllm-weights-", dir=shared_memory_root(self.nbytes)))
        self.path = self.directory / "weights"
        self.data: torch.Tensor | None = None  # the file, mapped: made at the first update
        # what vLLM loaded at its start (the model directory written from these tensors)
        self.signatures = {group: _signature(list(ts.values())) for group, ts in self._groups(model).items()}

    def _mapped(self) -> torch.Tensor:
        if self.data is None:
            with open(self.path, "wb") as f:
                f.truncate(self.nbytes)
            self.data = torch.from_file(str(self.path), shared=True, size=self.nbytes, dtype=torch.uint8)
        return self.data

    def view(self, name: str) -> torch.Tensor:
        """The file's slot of `name`, as a tensor (shares the file's memory)."""
        slot = self.slots[name]
        return self._mapped()[slot.offset: slot.offset + slot.nbytes].view(slot.dtype).view(slot.shape)

    def _groups(self, model: CausalLM) -> dict[str, dict[str, torch.Tensor]]:
        """trunk and head: the served tensors of each, by file name."""
        tensors = file_tensors(model, with_head=self.drafts)
        if tensors.keys() != self.slots.keys():
            raise ValueError("the model's tensors are not the ones its shared weights were laid out for")
        head = {name: t for name, t in tensors.items() if name.startswith(MTP_PREFIX)}
        return {"trunk": {name: t for name, t in tensors.items() if name not in head}, "head": head}

    def update(self, model: CausalLM) -> dict:
        """Write the groups whose tensors changed since the last write (every group, the first time: the file then
        holds all of the served weights) -> the update vLLM loads: the groups that changed."""
        first, changed = self.data is None, {}
        for group, tensors in self._groups(model).items():
            signature = _signature(list(tensors.values()))
            moved = signature != self.signatures.get(group) or None in signature
            if moved or first:
                with torch.no_grad():
                    for name, t in tensors.items():
                        self.view(name).copy_(t)
                self.signatures[group] = signature
            if moved:
                changed[group] = list(tensors)
        return self._update(changed.get("trunk", []), changed.get("head", []))

    def everything(self) -> dict:
        """The update that loads every served tensor from the last write (a worker started since; before any
        update the model directory it starts from is the last write: nothing)."""
        if self.data is None:
            return self._update([], [])
        head = [name for name in self.slots if name.startswith(MTP_PREFIX)]
        return self._update([name for name in self.slots if name not in head], head)

    def _update(self, trunk: list[str], head: list[str]) -> dict:
        draft = [*head, *(name for name in trunk if any(key in name for key in SHARED_WITH_DRAFTER))] if self.drafts \
            else []
        return {"path": str(self.path), "target": [self._entry(name) for name in trunk],
                "draft": [self._entry(name) for name in draft]}

    def _entry(self, name: str) -> list:
        slot = self.slots[name]
        return [name, str(slot.dtype).removeprefix("torch."), list(slot.shape), slot.offset]

    def close(self) -> None:
        self.data = None  # the mapping released with the last reference
        shutil.rmtree(self.directory, ignore_errors=True)
