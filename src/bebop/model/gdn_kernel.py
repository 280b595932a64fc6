"""The Gated DeltaNet recurrent rule as a CPU kernel (gdn_kernel.cpp, one of model/native.py's ops).

    kernel = gdn_kernel.cpu_kernel()          # None where it cannot be built or BEBOP_NATIVE=0
    if kernel is not None and gdn_kernel.fits(q, v, state, given=...):
        kernel(q, k, v, g, beta, state, states, out)   # writes states (T, B, Hv, Dk, Dv) and out (B, Hv, T, Dv)

The kernel reads each (row, head) state tile from memory once and writes it once where the pure-torch
`recurrent_rule` streams the whole batch's states through memory five times; it computes the same rule (and is
tested against it), with the states in float32 or bfloat16. It runs in every eager chunk that keeps its states
(decode steps, verifies) and, registered as an op that a graph being compiled calls, in a compiled verify and in a
compiled one-token step given its storage; a compiled one-token chunk that allocates its states keeps the torch
rule, which inductor fuses.
"""

from __future__ import annotations

import torch

from bebop.model import native

MAX_DV = 1024  # the kernel's scratch per value head (gdn_kernel.cpp's kMaxDv)

# torch.ops.bebop_native.gdn_recurrent where the native ops are loaded (built on first use), else None
cpu_kernel = native.Op("gdn_recurrent")


def fits(q: torch.Tensor, v: torch.Tensor, state: torch.Tensor, *, given: bool) -> bool:
    """Whether the kernel takes these operands (q (B, Hv, T, Dk)): float32 on a CPU (the state float32 or bfloat16),
    a value head within its scratch, and in a graph being compiled a chunk of more than one token (a verify) or one
    whose states go to storage the step was `given` (the cache's kept buffers). A one-token graph that allocates its
    states keeps the torch rule, which inductor fuses into two passes over the states; writing fresh memory, the
    kernel was slower there (docs/benchmarks.md)."""
    return (state.device.type == "cpu" and v.shape[-1] <= MAX_DV and q.dtype == v.dtype == torch.float32
            and state.dtype in (torch.float32, torch.bfloat16)
            and (q.shape[2] > 1 or given or not torch.compiler.is_compiling()))
