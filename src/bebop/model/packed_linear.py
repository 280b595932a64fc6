"""Linear layers that run inference on a CPU with oneDNN's packed weights.

    layer = PackedLinear(512, 3072, bias=False)   # an nn.Linear: same parameters, same state_dict
    with torch.no_grad(), decoding():
        y = layer(x)                              # on a CPU: oneDNN's matmul on a packed copy of the weight

A CPU matmul through `F.linear` reads the weight in its plain row-major layout; oneDNN's own kernels
want it reordered into their blocked layout first, which is what inductor does for a frozen graph
and what vLLM-CPU does at load time. Decoding multiplies by the same weights every step, so the
copy is made once and reused (docs/benchmarks.md has the measured gains: up to several times on
bfloat16 and on float32 at many rows). Small float32 products keep F.linear, whose fixed cost is lower.

The packed copy is used only inside `decoding()` (the engine's generate, speculative_generate and
cost profile enter it; a learner's no-grad passes, whose weights a sharded learner gathers anew, do
not), and only where it cannot be stale or in the way: no autograd (training takes `F.linear`), a CPU
tensor of the weight's dtype, a weight with a version counter (not one made under inference_mode).
A compiled decoding step takes the copies too: `prepare_graphs(model)` (the engine's steps_of, once an
engine call) sets each layer's `graph_weight`, an input of the graph like the weight, and the graph calls
oneDNN through an opaque op (inductor's own lowering wants a frozen constant): the native library's C++
`bebop_native::packed_linear` (model/native.py) where it built, else the Python custom op `bebop::packed_linear`;
in a graph the rows are not known, so there a float32 weight is packed by its size alone. The copy is
remade whenever the weight changes: the key is the weight tensor and its version counter, which every
in-place write bumps (an optimizer step, `load_state_dict`, a weight sync), so an RL step's update
reaches the next rollout. The copies are held apart from the module, by the weight's identity, and
leave with the weight; a layer's `graph_weight` reference is dropped from its copies and pickles, so
no copy is ever saved or copied with the model. `PACKED = False` (or BEBOP_PACKED_LINEAR=0) turns the
path off.

The float32 products that stay unpacked (a small weight at a few rows: every product of a decode step or a verify
at a small batch of a small model) run the native library's `small_linear` (model/small_linear.cpp) in the same
places, eager inside `decoding()` and in compiled graphs: over up to SMALL_ROWS rows it reads each weight once for
all of them, where the general matmul's fixed cost is most of such a call, and a row's numbers do not depend on the
other rows; over more rows it calls torch's linear itself.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from bebop.model import native

PACKED = os.environ.get("BEBOP_PACKED_LINEAR", "1") != "0"
_graph_op: Callable[..., torch.Tensor] | None = None  # what a graph calls (prepare_graphs: chosen on the host)
_small_op = native.Op("small_linear")  # the native few-rows float32 linear (None where the library is not there)
SMALL_ROWS = 8  # the rows small_linear takes itself (small_linear.cpp's kMaxRows); it calls torch's linear beyond
GRAPH_WEIGHT = "graph_weight"  # a PackedLinear's attribute that a compiled graph takes its packed copy from
_DTYPES = (torch.float32, torch.bfloat16)
# id(weight) -> (a weak reference to it, its version when packed, the packed copy); an entry leaves with its
# weight (a tensor's == is elementwise, so a WeakKeyDictionary, which compares keys, cannot hold tensors)
_COPIES: dict[int, tuple[weakref.ref, int, torch.Tensor]] = {}
_SCOPE = threading.local()  # .on: this thread is inside decoding()


@contextmanager
def decoding() -> Iterator[None]:
    """Inference matmuls in this thread may take packed weights (also a decorator)."""
    before = getattr(_SCOPE, "on", False)
    _SCOPE.on = True
    try:
        yield
    finally:
        _SCOPE.on = before


# a packed call has a fixed cost of its own: a float32 product takes it from this many weight elements or rows
# (below both, F.linear's small matmul is faster); bfloat16 takes it always (F.linear's is slower still)
MIN_WEIGHT = 300_000
MIN_ROWS = 32


@functools.cache
def _onednn(dtype: torch.dtype) -> bool:
    """Whether oneDNN's linear runs in `dtype` here (asked once a process, not on every call)."""
    supported = dtype == torch.float32 or torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return dtype in _DTYPES and torch.backends.mkldnn.is_available() and supported


def _can_pack(weight: torch.Tensor) -> bool:
    """oneDNN can multiply by a packed copy of `weight` that stays current: on a CPU, in a dtype oneDNN runs here,
    with a version counter (a weight made under inference_mode has none to notice a change)."""
    return PACKED and weight.device.type == "cpu" and not weight.is_inference() and _onednn(weight.dtype)


def _pays(weight: torch.Tensor, rows: int) -> bool:
    """The packed call's fixed cost pays: bfloat16 always, float32 from MIN_WEIGHT elements or MIN_ROWS rows."""
    return weight.dtype == torch.bfloat16 or weight.numel() >= MIN_WEIGHT or rows >= MIN_ROWS


def _usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """An eager product on the packed copy: inside decoding(), no autograd, a weight that can be packed and pays."""
    return (getattr(_SCOPE, "on", False) and x.dtype == weight.dtype and not torch.is_grad_enabled()
            and not torch.compiler.is_compiling() and _can_pack(weight) and _pays(weight, x.numel() // x.shape[-1]))


def packed_weight(weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's blocked copy of `weight` (out, in), remade when the weight's version counter moved."""
    key, version = id(weight), weight._version
    held = _COPIES.get(key)
    if held is None or held[0]() is not weight:  # never packed (an id can outlive its tensor and be reused)
        weakref.finalize(weight, _COPIES.pop, key, None)
        held = None
    if held is None or held[1] != version:
        held = (weakref.ref(weight), version, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1))
        _COPIES[key] = held
    return held[2]


@torch.library.custom_op("bebop::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """oneDNN's matmul on a packed weight, opaque to inductor (whose own lowering of it wants a frozen constant)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@packed_linear.register_fake
def _(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], out_features))


def prepare_graphs(model: nn.Module) -> str:
    """Before compiled decoding: each PackedLinear's packed copy where a graph takes it (remade if its weight changed),
    an input of the graph like the weight itself, and the op a graph calls on it. -> graph_weights(model)."""
    global _graph_op
    if _graph_op is None:  # from C++ where the native ops are there (each call skips a trip through Python)
        _graph_op = torch.ops.bebop_native.packed_linear if native.load() else packed_linear
    for module in model.modules():
        if isinstance(module, PackedLinear):
            pays = _can_pack(module.weight) and _pays(module.weight, rows=0)  # a graph's rows are not known
            module.graph_weight = packed_weight(module.weight) if pays else None
    return graph_weights(model)


def graph_weights(model: nn.Module) -> str:
    """Which PackedLinear layers a compiled graph of `model` multiplies by a packed copy, in module order ("1" each
    that does, "0" each that does not): part of a graph's key, since the copies themselves are not guarded."""
    return "".join("0" if m.graph_weight is None else "1" for m in model.modules() if isinstance(m, PackedLinear))


class PackedLinear(nn.Linear):
    graph_weight: torch.Tensor | None = None  # set by prepare_graphs

    def __getstate__(self) -> dict:
        """A copy or pickle leaves the packed copy behind (an opaque oneDNN tensor; prepare_graphs remakes it)."""
        state = dict(self.__dict__)
        state.pop("graph_weight", None)
        return state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            if not torch.is_grad_enabled() and x.dtype == self.weight.dtype:
                packed = self.graph_weight
                if packed is not None:
                    return (_graph_op or packed_linear)(x, packed, self.bias, self.out_features)
                small = _small_op() if _small_fits(x, self.weight) else None  # it takes any rows: more, torch's call
                if small is not None:
                    return small(x, self.weight, self.bias)
            return F.linear(x, self.weight, self.bias)
        if _usable(x, self.weight):
            return torch.ops.mkldnn._linear_pointwise(x, packed_weight(self.weight), self.bias, "none", [], "")
        small = _small_op() if getattr(_SCOPE, "on", False) and not torch.is_grad_enabled() else None
        if small is not None and _small_fits(x, self.weight) and x.numel() <= SMALL_ROWS * x.shape[-1]:
            return small(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


def _small_fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """small_linear takes the product itself (at up to SMALL_ROWS rows): float32 on a CPU, a contiguous weight."""
    return x.dtype == weight.dtype == torch.float32 and weight.device.type == "cpu" and weight.is_contiguous()
