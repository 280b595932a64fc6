"""bebop's native CPU ops (the library `bebop_native`), built for this machine on first use.

    if native.load():                            # False where they cannot be built, or BEBOP_NATIVE=0
        torch.ops.bebop_native.gdn_recurrent(...)    # gdn_kernel.cpp: the Gated DeltaNet recurrent rule
        torch.ops.bebop_native.packed_linear(...)    # packed_linear.cpp: oneDNN's matmul on a packed weight
        torch.ops.bebop_native.cached_attention(...) # attention_kernel.cpp: attention over a KV cache
        torch.ops.bebop_native.small_linear(...)     # small_linear.cpp: a float32 linear layer over a few rows

torch's C++ extension builder compiles SOURCES for this machine's instruction set (CFLAGS: `-march=native`, with the
compiler inductor uses, and ninja, a dependency) into torch's extension directory (TORCH_EXTENSIONS_DIR, by default
under ~/.cache): the first process on a machine waits for the build (about 20 s), later ones load it (0.1 s). The
build is named by the sources, the CPU's flags, torch and CFLAGS, so a shared home never loads another kind's. Where no
compiler or ninja is found the build fails once, with a warning naming why, and every caller takes its torch
path; the compile store keeps graphs apart by whether the library was there (engine/step_packages.py).
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from bebop import progress

HERE = Path(__file__).parent
SOURCES = tuple(HERE / name for name in ("gdn_kernel.cpp", "packed_linear.cpp", "attention_kernel.cpp", "small_linear.cpp"))
HEADERS = (HERE / "simd.h", HERE / "parallel.h")  # included by the sources: part of the build's name
ENV = "BEBOP_NATIVE"  # "0": never build or use the native ops
# for this machine; no fused multiply-add but those the sources write, so that two code paths written to compute
# alike (the kernel's per-position and column-block paths) round alike
# -fopenmp: the kernels' threads (parallel.h), in the OpenMP runtime torch has loaded
CFLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fopenmp")

_loaded = False
_tried = False  # load's body runs once a process


def _cpu_flags() -> str:
    """What -march=native compiles for."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _name() -> str:
    h = hashlib.sha256()
    for source in SOURCES + HEADERS:
        h.update(source.read_bytes())
    h.update(_cpu_flags().encode() + torch.__version__.encode() + " ".join(CFLAGS).encode())
    return f"bebop_native_{h.hexdigest()[:12]}"


def _library(name: str) -> Path | None:
    """Where cpp_extension.load puts the build of `name` (a private helper of torch's: without it, every process
    goes through load, which checks the build with ninja, about a second)."""
    from torch.utils import cpp_extension

    try:
        return Path(cpp_extension._get_build_directory(name, verbose=False)) / f"{name}.so"
    except Exception:
        return None


def load() -> bool:
    """Whether the native ops are there: loaded (or built) on the first call; False where they are off
    (BEBOP_NATIVE=0) or the build failed (a warning says why, once a process)."""
    global _loaded, _tried
    if _tried:
        return _loaded
    _tried = True
    if os.environ.get(ENV, "1") == "0":
        return False
    from torch.utils import cpp_extension

    name = _name()  # the sources, the CPU, torch and the flags: a build that exists is this one
    library = _library(name)
    try:
        if library is not None and library.exists():
            torch.ops.load_library(str(library))
        else:
            progress.write("bebop: building the native CPU ops (once per machine, about 20 s)")
            path = os.environ.get("PATH", "")
            os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), path])  # ninja's wheel is there
            try:
                cpp_extension.load(name, [str(s) for s in SOURCES], extra_cflags=list(CFLAGS), extra_ldflags=["-fopenmp"],
                                   is_python_module=False, verbose=False)
            finally:
                os.environ["PATH"] = path
        # what a graph being compiled sees of them (inductor then calls them as extern ops)
        torch.library.register_fake("bebop_native::gdn_recurrent")(_writes_only)
        torch.library.register_fake("bebop_native::packed_linear")(_linear_shape)
        torch.library.register_fake("bebop_native::cached_attention")(_attention_writes)
        torch.library.register_fake("bebop_native::small_linear")(_small_linear_shape)
        _loaded = True
    except Exception as e:  # no compiler, no ninja, an unknown -march: the torch paths serve
        lines = str(e).strip().splitlines() or [repr(e)]
        why = next((line.strip() for line in lines if "error" in line.lower() and "Error building" not in line), lines[-1])
        warnings.warn(f"bebop: the native CPU ops did not build ({type(e).__name__}: {why[:300]}); the hybrid's linear "
                      f"layers run the pure-torch rule and compiled matmuls call oneDNN through Python (set {ENV}=0 to "
                      "skip the build)", RuntimeWarning, stacklevel=2)
    return _loaded


class Op:
    """One of the library's ops as its Python callers ask for it: `op()` is torch.ops.bebop_native.<name> once the
    ops are loaded (load: built on first use), None where they are off (BEBOP_NATIVE=0), the build failed, or `off`
    is set (the tests and the A/B benchmarks: every caller then takes its torch path)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.off = False

    def __call__(self) -> Callable[..., Any] | None:
        if self.off or not load():
            return None
        return getattr(torch.ops.bebop_native, self.name)

    @contextmanager
    def disabled(self) -> Iterator[None]:
        """Inside, every caller takes its torch path (a test's reference, an A/B benchmark's other arm)."""
        off, self.off = self.off, True
        try:
            yield
        finally:
            self.off = off


def _writes_only(q, k, v, g, beta, state, states, out) -> None:
    """gdn_recurrent's fake: it writes `states` and `out` and returns nothing."""
    return None


def _attention_writes(q, k, v, mask, scale, out) -> None:
    """cached_attention's fake: it writes `out` and returns nothing."""
    return None


def _linear_shape(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """packed_linear's fake: (..., in) -> (..., out_features)."""
    return x.new_empty((*x.shape[:-1], out_features))


def _small_linear_shape(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """small_linear's fake: (..., in) -> (..., out)."""
    return x.new_empty((*x.shape[:-1], weight.shape[0]))
