"""Inductor's checks of the CPU's vector instruction sets, remembered from one process to the next.

    with isa_checked(store):   # around loading saved graphs: each check answered from an earlier process's outcome

Before a process loads its first compiled CPU kernel, inductor checks each vector instruction set the CPU
reports (AVX2, AVX-512 and its BF16 extension, AVX-512 VNNI, AMX and its FP16 extension) by building a tiny
library with that set's flags and loading it in a child Python process: half a dozen builds and child processes
in every new process, with every graph already compiled (docs/benchmarks.md). Each outcome depends on the CPU,
the C++ compiler and torch alone, so bebop keeps them in the compile store: a build check (its set's flags and
its code) that one process on this machine ran is answered from the record in a later one, failures included,
and only a check the record does not hold runs (and is added to it).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from bebop.fileio import atomic_write_text


@functools.cache
def _machine() -> dict | None:
    """What the checks' outcomes depend on, or None where inductor makes no such check (not an x86 CPU); read once
    a process (graphs are loaded key by key)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    from torch._inductor import cpp_builder, cpu_vec_isa

    compiler = cpp_builder.get_cpp_compiler()
    found = shutil.which(compiler)
    return {"isa": cpu_vec_isa.x86_isa_checker(), "torch": torch.__version__, "compiler": compiler,
            "compiler_file": os.path.realpath(found) if found else None,
            "compiler_mtime": os.path.getmtime(found) if found else None}


def _record(store: Path, machine: dict) -> Path:
    digest = hashlib.sha256(json.dumps(machine, sort_keys=True).encode()).hexdigest()[:16]
    return store / f"isa-builds-{digest}.json"


def _read(record: Path) -> dict[str, bool]:
    """The recorded outcomes (build check -> passed), none where the record is missing or unreadable."""
    try:
        builds = json.loads(record.read_text())["builds"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return {k: v for k, v in builds.items() if isinstance(v, bool)} if isinstance(builds, dict) else {}


def build_check(isa: Any, code: str) -> str:
    """One build check's name: the set, the flags it builds with (a set's sub-checks add their extension's flag)
    and the code it builds."""
    return hashlib.sha256(f"{type(isa).__name__}\0{isa.build_arch_flags()}\0{code}".encode()).hexdigest()[:24]


@contextlib.contextmanager
def isa_checked(store: Path) -> Iterator[None]:
    """Inside: each of inductor's build checks answered from `store`'s record for this machine where an earlier
    process ran it; the others run as usual and are recorded after the block."""
    machine = _machine()
    if machine is None:
        yield
        return
    from torch._inductor.cpu_vec_isa import VecISA

    record = _record(store, machine)
    known = _read(record)
    found: dict[str, bool] = {}
    check = VecISA.check_build

    def remembered(isa: Any, code: str) -> bool:
        name = build_check(isa, code)
        if name not in known:
            known[name] = found[name] = bool(check(isa, code))
        return known[name]

    VecISA.check_build = remembered  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        VecISA.check_build = check  # type: ignore[method-assign]
        if found:
            with contextlib.suppress(OSError):
                store.mkdir(parents=True, exist_ok=True)
                atomic_write_text(record, json.dumps({**machine, "builds": known}, indent=1))
