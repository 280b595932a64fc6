"""Compiled step functions kept on disk, so that a new process loads its graphs instead of compiling them.

    graph = packaged(_verify, model)              # one per step function and model kind, shared in a process
    out, warmup_s = graph(key, dynamic, True, *args)   # a graph whose guards pass, else one compiled and saved
    has_packages(model)                           # `--compile auto` runs the saved graphs of a short run

torch.compile traces every graph again in each new process (dynamo's tracing is most of a warm start: inductor's
cache keeps only generated code). Here each graph is compiled ahead of time with dynamo's `aot_compile` (the
traced bytecode, its guards and inductor's code in one file) and saved; a later process deserialises the files
for the calls it meets and checks their guards itself, so tracing happens once per model kind, not per process.

The store: `$BEBOP_COMPILE_CACHE`, else `bebop/` in inductor's cache folder (TORCHINDUCTOR_CACHE_DIR, by default
under /tmp), one folder per model kind: a digest of the model's config, bebop's own source, torch's and
Python's versions, inductor's options and the CPU's instruction set (what a graph bakes in without a guard on it; a changed bebop
or torch compiles anew). In it, one file per graph, named by the call's key (the step's name, its batch and
chunk class, dtype, and its non-tensor arguments: sampling, mode, depth), written atomically; `about.json`
says what the folder is for; `--k auto`'s cost tables are kept there too (engine/step_costs.py). Files that
cannot be read (another torch, a truncated write) are removed and compiled again. A store that cannot be
written leaves the graphs in memory for this process only.

Dynamic dimensions (the batch, the span, k) are marked on the inputs only while a graph compiles: a saved
guard checks a tensor's markings against none, so a call's inputs go in unmarked. Loading a graph's kernels
makes inductor check the CPU's vector instruction sets, which engine/isa_check.py answers from a record once
one process on this machine has checked them.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.fx.experimental import _config as fx_config

import bebop
from bebop.engine.isa_check import isa_checked
from bebop.fileio import atomic_write, atomic_write_text
from bebop.model import native
from bebop.model.packed_linear import GRAPH_WEIGHT

STORE_ENV = "BEBOP_COMPILE_CACHE"
SUFFIX = ".pt2"
_MARKS = ("_dynamo_dynamic_indices", "_dynamo_weak_dynamic_indices", "_has_dynamo_dim_marking")

Dynamic = list[tuple[torch.Tensor, int, bool]]  # (tensor, dimension, strong): mark_dynamic, else maybe_mark_dynamic
# a trusted call (one whose signature matched that of a call that passed the guards) checks them anyway and fails if
# they do not pass: the tests' setting, which holds every trusted call of the suite to its graph's guards
CHECK_TRUSTED = False


def store_root() -> Path:
    """Where packages are kept: $BEBOP_COMPILE_CACHE, else bebop/ in inductor's cache folder."""
    env = os.environ.get(STORE_ENV)
    return Path(env) if env else default_store_root()


def default_store_root() -> Path:
    """bebop/ in inductor's cache folder (TORCHINDUCTOR_CACHE_DIR, by default under /tmp)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir()) / "bebop"


@functools.cache
def source_digest() -> str:
    """A digest of bebop's Python source: a graph traced from other code is another graph."""
    h = hashlib.sha256()
    root = Path(bebop.__file__).parent
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def model_kind(model: torch.nn.Module) -> dict[str, Any]:
    """What a model's graphs depend on beyond their guards (readable; its digest names the store's folder)."""
    config = getattr(model, "config", None)
    device = str(next(model.parameters()).device.type)
    return {
        "config": config.to_dict() if config is not None else type(model).__name__,
        "head": getattr(model, "mtp", None) is not None,
        "device": device, "inductor": inductor_options(device),
        "bebop": bebop.__version__, "source": source_digest(), "torch": torch.__version__,
        "python": "%d.%d" % sys.version_info[:2], "cpu": torch.backends.cpu.get_cpu_capability(),
        # graphs on a CPU call the native ops where they built (the matmuls, a hybrid's Gated DeltaNet kernel), the
        # Python op and the torch rule where they did not
        "native": device == "cpu" and native.load(),
    }


def inductor_options(device: str) -> dict[str, Any]:
    """Inductor's options for a step graph on `device`. On a CPU the graph's wrapper (the code that allocates its
    buffers and calls its kernels, a few hundred Python lines per call) is generated as C++ (`cpp_wrapper`): the
    kernels are the same, the host time per call is a fraction (docs/benchmarks.md). Elsewhere inductor's
    defaults, not yet measured on a device."""
    return {"cpp_wrapper": True} if device == "cpu" else {}


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


class CompileFailed(Exception):
    """A graph could not be compiled (the reason in one line): the step runs eagerly."""


_SHARED: dict[tuple[str, str], PackagedGraph] = {}
_UNSAVED: set[Path] = set()  # folders that could not be written


def packaged(fn: Callable, model: torch.nn.Module) -> PackagedGraph:
    """The packaged graphs of `fn` for models of `model`'s kind (shared by every such model in this process)."""
    kind = model_kind(model)
    key = (fn.__qualname__, _digest(kind))
    if key not in _SHARED:
        _SHARED[key] = PackagedGraph(fn, key[1], kind)
    return _SHARED[key]


def kind_file(model: torch.nn.Module, stem: str, key: Any, suffix: str) -> Path:
    """A file kept beside the graphs of `model`'s kind (so it is dropped with them when bebop or torch changes),
    named by `stem` and a digest of `key`."""
    return store_root() / _digest(model_kind(model)) / f"{stem}-{_digest(key)}{suffix}"


def has_packages(model: torch.nn.Module) -> bool:
    """Whether the store holds graphs for models of `model`'s kind (what `--compile auto` loads)."""
    folder = store_root() / _digest(model_kind(model))
    return folder.is_dir() and any(folder.glob(f"*{SUFFIX}"))


class PackagedGraph:
    """One step function's graphs: loaded from its folder when a key is first met, compiled and saved when none
    fits. `made` / `loaded`: graphs compiled / read from disk in this process."""

    def __init__(self, fn: Callable, digest: str, kind: dict[str, Any]) -> None:
        self.fn = fn
        self.digest = digest  # of `kind`: the store's folder for it
        self.kind = kind
        self.compiler = torch.compile(fn, fullgraph=True, dynamic=False,
                                      options={**kind["inductor"], "guard_filter_fn": saved_guards})
        self.entries: dict[str, list[Any]] = {}  # key digest -> AOTCompiledFunction, most recently used first
        self.names: dict[tuple, str] = {}  # key -> its file name stem (a digest of its repr, made once)
        self.ran: set[int] = set()  # ids of the entries that have run in this process
        self.trusted: dict[str, tuple[Any, Any]] = {}  # key's name -> (the last call's trust, the graph it ran)
        self.made = 0
        self.loaded = 0

    def __call__(self, key: tuple, dynamic: Callable[[], Dynamic], compile_new: bool,
                 *args: Any, trust: Any = None) -> tuple[Any, float] | None:
        """fn(*args) through a graph whose guards pass, compiled and saved if none does and `compile_new`: (its
        output, seconds spent loading or compiling); None when no graph fits and none is to be compiled.
        `dynamic()`: the dimensions a new graph leaves dynamic, asked only when one is compiled. `trust`: the call's
        signature (hashable, None: none), a promise that two calls of one key with equal signatures pass the same
        graph's guards: a call whose signature is that of the last call of its key runs that call's graph without
        checking them (the check walks every input and the model's modules: a tenth of a small model's step)."""
        name = self.names.get(key)
        if name is None:
            name = self.names[key] = f"{self.fn.__name__.strip('_')}-{_digest(repr(key))}"
        if trust is not None:
            known = self.trusted.get(name)
            if known is not None and known[0] == trust:
                if CHECK_TRUSTED and not known[1].guard_check(*args):
                    raise AssertionError(f"a call trusted to pass the guards of {name} fails them")
                return known[1].fn(*args), 0.0
        entries, warmup = self.entries.get(name), 0.0
        if entries is None:  # the first call with this key: its graphs on disk
            start = time.perf_counter()
            entries = self.entries[name] = self._load(name)
            warmup = time.perf_counter() - start
        for i, entry in enumerate(entries):
            if entry.guard_check(*args):
                if i:
                    entries.insert(0, entries.pop(i))
                self.trusted[name] = (trust, entry)
                if id(entry) in self.ran:
                    return entry.fn(*args), warmup
                start = time.perf_counter()  # a loaded graph's first run loads its kernels: warm-up, not a step
                out = entry.fn(*args)
                self.ran.add(id(entry))
                return out, warmup + time.perf_counter() - start
        if not compile_new:
            return None
        start = time.perf_counter()
        try:
            # no duck shapes: dimensions that happen to be equal in this call (a refresh as wide as the verify's
            # chunk, a batch as large as the step's draws) stay apart, so a later call where they differ fits
            with _marked(dynamic()), fx_config.patch(use_duck_shape=False):  # type: ignore[attr-defined]
                entry = self.compiler.aot_compile((args, {}))  # type: ignore[attr-defined]
        except Exception as err:  # dynamo, inductor, the C++ toolchain, or aot_compile's own refusals
            raise CompileFailed(one_line(err)) from err
        entry.disable_guard_check()  # checked above, once a call
        self.ran.add(id(entry))  # its first run below counts as its compile's
        self.made += 1
        self._save(name, entry)
        entries.insert(0, entry)
        self.trusted[name] = (trust, entry)
        out = entry.fn(*args)
        return out, warmup + time.perf_counter() - start

    @property
    def folder(self) -> Path:
        return store_root() / self.digest

    def _load(self, name: str) -> list[Any]:
        from torch._dynamo.aot_compile import AOTCompiledFunction
        from torch._inductor import config

        out = []
        # loading the kernels asks which instruction sets this CPU runs; a graph whose guards cannot be made here
        # (they name code this process does not have) is a file that cannot be read, not an error to log; a kernel
        # library already built needs no precompiled header (inductor would preprocess its headers again, in
        # every process, to see whether the header is current)
        with isa_checked(store_root()), _quiet("torch._guards"), config.patch(cpp_cache_precompile_headers=False):
            for path in sorted(self.folder.glob(f"{name}-*{SUFFIX}")):
                try:
                    entry = AOTCompiledFunction.deserialize(path.read_bytes())
                except Exception:  # another torch's or a truncated file: compiled again when needed
                    with contextlib.suppress(OSError):
                        path.unlink()
                    continue
                entry.disable_guard_check()
                out.append(entry)
                self.loaded += 1
        return out

    def _save(self, name: str, entry: Any) -> None:
        folder = self.folder
        try:
            folder.mkdir(parents=True, exist_ok=True)
            about = folder / "about.json"
            if not about.exists():
                atomic_write_text(about, json.dumps(self.kind, indent=1, default=str))
            atomic_write(folder / f"{name}-{uuid.uuid4().hex[:8]}{SUFFIX}", entry.save_compiled_function)
        except (OSError, RuntimeError) as err:
            if folder not in _UNSAVED:  # said once a folder
                _UNSAVED.add(folder)
                print(f"bebop: --compile: cannot save compiled steps in {folder} ({type(err).__name__}: {err}); "
                      f"a later process compiles them again", file=sys.stderr)


def saved_guards(guards: Sequence[Any]) -> list[bool]:
    """Which of a graph's guards it keeps (dynamo's guard filter): those a saved graph can hold (dynamo's own choice
    for ahead-of-time graphs: no guards on globals or on what cannot be written to a file), less those on a
    packed weight copy (model/packed_linear.py's GRAPH_WEIGHT): an opaque oneDNN tensor that cannot be saved with
    the guards. Whether the graph takes packed copies at all is in its key instead (compiled.py), and their shapes
    follow from the weights', which stay guarded. Less, too, the guards that each module's hook dictionaries are
    empty (six a module, two fifths of a step graph's guards) where dynamo itself does not check them
    (`skip_nnmodule_hook_guards`, its default): a graph compiled in this process runs without them, but a saved
    one would rebuild each when it loads, and half its load time went to that (docs/benchmarks.md)."""
    from torch._dynamo import config
    from torch._dynamo.guards import CheckFunctionManager

    unsaved = set(getattr(CheckFunctionManager, "UNSUPPORTED_SERIALIZATION_GUARD_TYPES", ()))
    if config.skip_nnmodule_hook_guards:
        unsaved.add("EMPTY_NN_MODULE_HOOKS_DICT")
    return [not (g.is_global or g.guard_type in unsaved or f".{GRAPH_WEIGHT}" in g.name) for g in guards]


def one_line(err: BaseException) -> str:
    """An error as one short line: its type and the first line of its message."""
    return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:200]}"


def graph_count() -> int:
    """Graphs compiled or loaded in this process, every step function and model kind."""
    return sum(g.made + g.loaded for g in _SHARED.values())


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    """`logger`'s records below CRITICAL dropped for the block."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


@contextlib.contextmanager
def _marked(dynamic: Dynamic) -> Iterator[None]:
    """The dimensions in `dynamic` marked dynamic for a compile, unmarked after it."""
    try:
        for t, dim, strong in dynamic:
            (torch._dynamo.mark_dynamic if strong else torch._dynamo.maybe_mark_dynamic)(t, dim)
        yield
    finally:
        for t, _, _ in dynamic:
            for attr in _MARKS:
                if hasattr(t, attr):
                    delattr(t, attr)
