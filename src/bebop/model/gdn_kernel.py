"""The Gated DeltaNet recurrent rule as a CPU kernel (gdn_kernel.cpp), built on first use.

    kernel = gdn_kernel.cpu_kernel()          # None where it cannot be built or BEBOP_NATIVE=0
    if kernel is not None and gdn_kernel.fits(q, v, state):
        kernel(q, k, v, g, beta, state, states, out)   # writes states (T, B, Hv, Dk, Dv) and out (B, Hv, T, Dv)

The kernel reads each (row, head) state tile from memory once and writes it once where the pure-torch
`recurrent_rule` streams the whole batch's states through memory five times; it computes the same rule (and is
tested against it). It runs in every eager chunk that keeps its states (decode steps, verifies) and, registered
as an op that a graph being compiled calls, in a compiled verify; a compiled one-token step keeps the torch rule,
which inductor fuses. torch's C++ extension builder compiles it for this machine's instruction set (with the
compiler inductor uses, and ninja, a dependency) into torch's extension directory (TORCH_EXTENSIONS_DIR, by default
under ~/.cache): the first process on a machine waits for the build (about 20 s), later ones load it. Where no
compiler or ninja is found the build fails once, with a warning naming why, and every layer runs the torch rule;
the compile store keeps a hybrid's graphs apart by whether the kernel was there (engine/step_packages.py).
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from bebop import progress

SOURCE = Path(__file__).with_name("gdn_kernel.cpp")
MAX_DV = 1024  # the kernel's scratch per value head (gdn_kernel.cpp's kMaxDv)
ENV = "BEBOP_NATIVE"  # "0": never build or use native kernels

_kernel: Callable[..., None] | None = None
_tried = False  # cpu_kernel's body runs once a process


def _cpu_flags() -> str:
    """What -march=native compiles for: the build is named after it, so a shared home never loads another kind's."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _name() -> str:
    digest = hashlib.sha256(SOURCE.read_bytes() + _cpu_flags().encode() + torch.__version__.encode()).hexdigest()
    return f"bebop_gdn_{digest[:12]}"


def _library(name: str) -> Path | None:
    """Where cpp_extension.load puts the build of `name` (a private helper of torch's: without it, every process
    goes through load, which checks the build with ninja, about a second)."""
    from torch.utils import cpp_extension

    try:
        return Path(cpp_extension._get_build_directory(name, verbose=False)) / f"{name}.so"
    except Exception:
        return None


def cpu_kernel() -> Callable[..., None] | None:
    """torch.ops.bebop_native.gdn_recurrent, loaded (or built) on the first call; None where native kernels are
    off (BEBOP_NATIVE=0) or the build failed (a warning says why, once a process)."""
    global _kernel, _tried
    if _tried:
        return _kernel
    _tried = True
    if os.environ.get(ENV, "1") == "0":
        return None
    from torch.utils import cpp_extension

    name = _name()  # the source, the CPU and torch: a build that exists is this one
    library = _library(name)
    try:
        if library is not None and library.exists():
            torch.ops.load_library(str(library))
        else:
            progress.write("bebop: building the Gated DeltaNet CPU kernel (once per machine, about 20 s)")
            path = os.environ.get("PATH", "")
            os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), path])  # ninja's wheel is there
            try:
                cpp_extension.load(name, [str(SOURCE)], extra_cflags=["-O3", "-march=native"], is_python_module=False,
                                   verbose=False)
            finally:
                os.environ["PATH"] = path
        _kernel = torch.ops.bebop_native.gdn_recurrent
        # what a graph being compiled sees of it (inductor then calls it as an extern op): writes, no result
        torch.library.register_fake("bebop_native::gdn_recurrent")(_writes_only)
    except Exception as e:  # no compiler, no ninja, an unknown -march: the torch rule serves
        lines = str(e).strip().splitlines() or [repr(e)]
        why = next((line.strip() for line in lines if "error" in line.lower() and "Error building" not in line), lines[-1])
        warnings.warn(f"bebop: the Gated DeltaNet CPU kernel did not build ({type(e).__name__}: {why[:300]}); the "
                      f"hybrid's linear layers run the pure-torch rule (set {ENV}=0 to skip the build)", RuntimeWarning,
                      stacklevel=2)
    return _kernel


def _writes_only(q, k, v, g, beta, state, states, out) -> None:
    """The kernel's fake: it writes `states` and `out` and returns nothing."""
    return None


def fits(q: torch.Tensor, v: torch.Tensor, state: torch.Tensor, *, given: bool) -> bool:
    """Whether the kernel takes these operands (q (B, Hv, T, Dk)): float32 on a CPU (the state float32 or bfloat16),
    a value head within its scratch, and in a graph being compiled a chunk of more than one token (a verify) or one
    whose states go to storage the step was `given` (the cache's kept buffers). A one-token graph that allocates its
    states keeps the torch rule, which inductor fuses into two passes over the states; writing fresh memory, the
    kernel was slower there (docs/benchmarks.md)."""
    return (state.device.type == "cpu" and v.shape[-1] <= MAX_DV and q.dtype == v.dtype == torch.float32
            and state.dtype in (torch.float32, torch.bfloat16)
            and (q.shape[2] > 1 or given or not torch.compiler.is_compiling()))
