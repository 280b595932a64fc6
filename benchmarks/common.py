"""Helpers shared by the benchmarks: machine description and median-of-runs timing."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable

import torch


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            names = [line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads, python {platform.python_version()}")


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median(values: list[float]) -> float:
    return statistics.median(values)


def peak_cpu_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes that tensors allocated while `fn` runs held at once on the CPU (beyond what was live before).

    Read from torch's profiler (profile_memory=True): each CPU allocation event carries the allocator's
    running total of the bytes it tracks, which counts only allocations made while profiling, so the
    total at the first event minus that event's size is the baseline."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            events.append((node.start_time_ns, node.extra_fields))
    if not events:
        return 0
    events.sort(key=lambda e: e[0])
    first = events[0][1]
    base = first.total_allocated - first.alloc_size
    return max(e.total_allocated for _, e in events) - base
