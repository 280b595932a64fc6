"""Inductor's check of the CPU's vector instruction sets, remembered from one process to the next.

    with isa_checked(store):   # around loading saved graphs: inductor is told what an earlier process found
        ...

Before a process loads its first compiled CPU kernel, inductor checks each vector instruction set the CPU
reports (AVX2, AVX-512, AVX-512 VNNI, AMX) by building a tiny library with that set's flags and loading it in a
child Python process: about a second on a small CPU, in every new process, with every graph already compiled.
Its outcome depends on the CPU, the C++ compiler and torch alone, so bebop keeps it in the compile store: once a
process has found that every set the CPU reports builds and loads, a later process on the same CPU, compiler and
torch tells inductor so (its `cpp.vec_isa_ok`) instead of checking again. Where a set failed its check nothing
is kept, and inductor checks in every process as before.
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

import torch

from bebop.fileio import atomic_write_text


@functools.cache
def _machine() -> dict | None:
    """What the check's outcome depends on, or None where inductor makes no such check (not an x86 CPU); read once
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
    return store / f"isa-check-{digest}.json"


def _all_reported_pass() -> bool | None:
    """Whether every instruction set the CPU reports passed inductor's check in this process (None: not checked)."""
    from torch._inductor import cpu_vec_isa

    if not cpu_vec_isa.valid_vec_isa_list.cache_info().currsize:
        return None
    reported = set(cpu_vec_isa.x86_isa_checker())
    wanted = [str(isa) for isa in cpu_vec_isa.supported_vec_isa_list if set(str(isa).split()) <= reported]
    return [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()] == wanted


@contextlib.contextmanager
def isa_checked(store: Path) -> Iterator[None]:
    """Inside: inductor's instruction-set check answered from `store`'s record where an earlier process on this
    machine found every set the CPU reports usable; otherwise checked as usual, and recorded after when all pass."""
    machine = _machine()
    if machine is None:
        yield
        return
    record = _record(store, machine)
    if record.is_file():
        from torch._inductor import config

        with config.patch({"cpp.vec_isa_ok": True}):
            yield
        return
    yield
    if _all_reported_pass():
        with contextlib.suppress(OSError):
            store.mkdir(parents=True, exist_ok=True)
            atomic_write_text(record, json.dumps(machine, indent=1))
