"""vLLM's weight-transfer engine for bebop's shared-memory weights (worker side; imports only torch and vllm).

bebop (bebop/vllm/shared_weights.py) keeps every tensor vLLM serves in one file in shared memory, at fixed
offsets, and writes into it only what changed since vLLM's last load. An update names the tensors to load as
[name, dtype, shape, offset] entries; this engine maps the file once and hands vLLM views of it, in checkpoint
format, inside vLLM's own weight-update sessions (`start_weight_update` / `start_draft_weight_update`, then
`update_weights`, then `finish_weight_update`): the draft session loads into the drafter with the draft model's
config, and the layerwise reload undoes and redoes each layer's kernel processing (the CPU kernels' weight
packing) around the load, as vLLM's own IPC and NCCL engines do.

    register()     # once, before the LLM is made with weight_transfer_config={"backend": BACKEND}
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

BACKEND = "bebop_shm"


@dataclass
class SharedMemoryInitInfo(WeightTransferInitInfo):
    """No rendezvous: the file's path comes with each update."""


@dataclass
class SharedMemoryUpdateInfo(WeightTransferUpdateInfo):
    path: str = ""  # the shared-memory file
    tensors: list = field(default_factory=list)  # [[name, dtype name, shape, byte offset], ...]


class SharedMemoryEngine(WeightTransferEngine[SharedMemoryInitInfo, SharedMemoryUpdateInfo]):
    init_info_cls = SharedMemoryInitInfo
    update_info_cls = SharedMemoryUpdateInfo

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._maps: dict[str, torch.Tensor] = {}  # path -> the file mapped as bytes (shared, never copied)

    def init_transfer_engine(self, init_info: SharedMemoryInitInfo) -> None:
        pass

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def _mapped(self, path: str) -> torch.Tensor:
        if path not in self._maps:
            self._maps[path] = torch.from_file(path, shared=True, size=os.path.getsize(path), dtype=torch.uint8)
        return self._maps[path]

    def receive_weights(self, update_info: SharedMemoryUpdateInfo) -> None:
        data = self._mapped(update_info.path)
        weights = []
        for name, dtype_name, shape, offset in update_info.tensors:
            dtype = getattr(torch, dtype_name)
            nbytes = math.prod(shape) * dtype.itemsize
            weights.append((name, data[offset: offset + nbytes].view(dtype).view(shape)))
        from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check

        with disable_mtp_completeness_check():  # an update may carry a part of the model (the head alone)
            self.model.load_weights(weights)

    def shutdown(self) -> None:
        self._maps.clear()


def register() -> None:
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    try:
        WeightTransferEngineFactory.register_engine(BACKEND, SharedMemoryEngine)
    except ValueError:  # registered already (a second LLM in this process)
        pass
