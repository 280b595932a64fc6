"""Compiled decoding steps: `--compile auto|on|off` (inductor on the CPU).

    compile_steps(model, "on")              # or "auto" with the run's expected decode steps
    steps = prepared_steps(model)           # an engine call takes its step functions once and passes them on
    hidden = steps.forward(model, ids, cache, counts)                    # plain decoding's step
    drafts, draft_probs = steps.draft_chain(model, head_cache, ...)    # a speculative step's two verbs:
    hidden, host = steps.verify(model, cache, ids, counts, is_draft, drafts, draft_probs, draws, ...)

A model's compiled steps are kept beside it in a weak map (a model freed frees its graphs; a copy of a model is
not compiled until compile_steps says so), read once per engine call, not per forward.

What compiles, each as one graph (torch.compile's fullgraph) over bebop.model.static_cache's view of the
preallocated KV cache (views of its used span, written in place), so a graph depends on no host state:
- the trunk forward over a chunk: plain decoding's step and a prefill (engine/prefill.py), one graph for every
  chunk length from 2 up (a hybrid trunk: chunks of at most MAX_COMPILED_CHUNK tokens, its graphs one per length);
- the head's forward over a prefill's positions (spec_step.head_forward), its width dynamic;
- a speculative step drafting with the head, whole (engine/spec_step.py's speculative_step): the head's
  refresh over the positions pending for it (its width dynamic), each drafting forward after it with its
  warp and draw, and the verify (the trunk forward over k + 1 tokens, the warps, the plain draw, the RS /
  TO acceptance, log-probs, entropies, the finiteness check), with the step's uniforms passed in: one graph
  per k over both caches, so a step is one graph call and one host read (a catch-up over any number of
  plain steps before it included);
- the same verbs as graphs of their own, for a step that cannot run whole (another drafter's drafts, a
  step feeding an observation): the refresh, the drafting forward (with one head layer, one graph serves
  every depth) and the verify, k a dynamic dimension of it (one graph for k = 0, a plain step of `--k
  auto`, one for k = 1, which torch specialises, one for every k from 2).
The batch and span dimensions are dynamic too: one graph serves every live-batch size from 2 up (one
more for batch 1) and every span, so a step at any batch size, length and k, a run with other prompts
and every RL step reuse it, with no padding rows. Weights are graph inputs, and the graphs guard on the
module's structure, not its identity: an optimizer's in-place update (each RL step) and a copy of the
same shape reuse them. A hybrid trunk compiles too (static_cache.HybridStaticView: what a chunk staged, its
Gated DeltaNet states after each position, comes back from the graph, and the host selects each row's); its
recurrence runs token by token, so its graphs are one per chunk length (k), not dynamic in it; the graph writes the
states into storage the cache keeps (LinearStates.stagings, passed in), on a CPU with gdn_kernel's C++ kernel. What
stays eager (the same functions, uncompiled): a hybrid's prefill, a verbs' catch-up
refresh wider than MAX_COMPILED_CHUNK, a speculative step that feeds an observation, a hybrid cache's rollback and its
selection of the states after a chunk.

Each graph is compiled ahead of time and saved (engine/step_packages.py: a store keyed by the model's kind,
bebop's source and torch's version): its first compile costs tens of seconds on a small CPU, a later process
loads it in a fraction of a second (docs/benchmarks.md). `auto` compiles new graphs only in a run of at least
PAYS_AFTER_STEPS decode steps; a shorter one of at least LOADS_PAY_AFTER_STEPS still runs the graphs the store
holds, and the rest eagerly (loading them costs about a second or two: more than a few hundred eager steps save).

A compile that fails (no C++ compiler, a graph break) prints one line and the run goes on eager.
The math is the eager forward's (the same modules; attention over masked zeros past a row's length
adds exact zeros), so every lossless and T=0 guarantee holds on the compiled path too.
"""

from __future__ import annotations

import itertools
import sys
import weakref
from collections import Counter
from functools import partial
from typing import Any

import torch

from bebop.engine.spec_step import draft_chain, draft_next, draft_refresh, head_forward, speculative_step, verify
from bebop.engine.step_packages import CompileFailed, Dynamic, has_packages, one_line, packaged
from bebop.errors import BebopError
from bebop.model.hybrid_cache import HybridCache
from bebop.model.kv_cache import KVCache
from bebop.model.packed_linear import graph_weights, prepare_graphs
from bebop.model.qwen3 import CausalLM
from bebop.model.rope import rope_table
from bebop.model.static_cache import HybridStaticView, StaticView, same_rows
from bebop.sampling import SamplingParams

COMPILE_CHOICES = ("auto", "on", "off")
MAX_COMPILED_CHUNK = 9  # a verify over MAX_K + 1 tokens; a hybrid's longer chunks (its prefills) run eager
PAYS_AFTER_STEPS = 20_000  # `auto`: decode steps that pay for cold compiles (docs/benchmarks.md)
LOADS_PAY_AFTER_STEPS = 500  # `auto`: decode steps that pay for loading saved graphs (docs/benchmarks.md)

_STEPS: weakref.WeakKeyDictionary[CausalLM, CompiledSteps] = weakref.WeakKeyDictionary()
_CALLS = itertools.count()  # engine calls (prepared_steps): a graph's guards are checked anew in each


def check_compile(choice: str) -> None:
    if choice not in COMPILE_CHOICES:
        raise BebopError(f"--compile must be one of {', '.join(COMPILE_CHOICES)}, got {choice!r}")


def wants_compile(choice: str, decode_steps: int) -> bool:
    """Whether `choice` compiles a run expected to take `decode_steps` decode steps."""
    check_compile(choice)
    return choice == "on" or (choice == "auto" and decode_steps >= PAYS_AFTER_STEPS)


def expected_decode_steps(rows: int, batch_size: int, max_new_tokens: int) -> int:
    """About how many decode steps `rows` prompts take, `batch_size` a call (for `auto`): the longest row's."""
    return -(-rows // batch_size) * max_new_tokens


def compile_steps(model: CausalLM, choice: str, decode_steps: int = 0) -> bool:
    """Compile `model`'s decoding steps when `choice` says so (idempotent); False when it runs eager. A run too short
    to pay for compiling (`auto`) but long enough to pay for loading still runs the graphs a store holds for its
    model kind (step_packages.py), and the rest of its steps eagerly."""
    compile_new = wants_compile(choice, decode_steps)
    loads = choice == "auto" and decode_steps >= LOADS_PAY_AFTER_STEPS and has_packages(model)
    if not compile_new and not loads:
        _STEPS.pop(model, None)
        return False
    if model not in _STEPS:
        _STEPS[model] = CompiledSteps(model)
    _STEPS[model].compile_new = compile_new
    return True


def steps_of(model: CausalLM) -> EagerSteps:
    """The step functions the engine runs `model`'s decoding with: its compiled steps (compile_steps), else eager."""
    return _STEPS.get(model) or EAGER


def prepared_steps(model: CausalLM) -> EagerSteps:
    """steps_of, with the packed weight copies its graphs take made current (model/packed_linear.py): what an engine
    call takes once, before its first step, and passes on."""
    steps = steps_of(model)
    if isinstance(steps, CompiledSteps):
        steps.packed = prepare_graphs(model)
        steps.engine_call = next(_CALLS)
    return steps


def compiled_steps(model: CausalLM) -> CompiledSteps | None:
    return _STEPS.get(model)


def is_compiled(model: CausalLM) -> bool:
    steps = _STEPS.get(model)
    return steps is not None and steps.failed is None


class EagerSteps:
    """A decoding step's functions, run eagerly (the modules' forwards and engine/spec_step.py's verbs): what the
    engine calls. CompiledSteps runs the same functions compiled where it can."""

    def forward(self, model: CausalLM, ids: torch.Tensor, cache: KVCache, counts: torch.Tensor) -> torch.Tensor:
        """model(ids, cache, counts): ids (B, T), counts (B,) -> hidden (B, T, H)."""
        return model(ids, cache, counts)

    def head_forward(self, model: CausalLM, head_cache: KVCache, ref_hidden: torch.Tensor, ref_tokens: torch.Tensor,
                     ref_count: torch.Tensor) -> torch.Tensor:
        """spec_step.head_forward: the head over a prefill's positions (R, W, H)."""
        return head_forward(model, head_cache, ref_hidden, ref_tokens, ref_count)

    def draft_refresh(self, model: CausalLM, head_cache: KVCache, ref_hidden: torch.Tensor, ref_tokens: torch.Tensor,
                      ref_count: torch.Tensor, draws: torch.Tensor, *, mode: str, sampling: SamplingParams):
        return draft_refresh(model, head_cache, ref_hidden, ref_tokens, ref_count, draws, mode=mode, sampling=sampling)

    def draft_next(self, model: CausalLM, head_cache: KVCache, hidden: torch.Tensor, token: torch.Tensor,
                   draws: torch.Tensor, *, depth: int, mode: str, sampling: SamplingParams):
        return draft_next(model, head_cache, hidden, token, draws, depth=depth, mode=mode, sampling=sampling)

    def draft_chain(self, model: CausalLM, head_cache: KVCache, ref_hidden: torch.Tensor, ref_tokens: torch.Tensor,
                    ref_count: torch.Tensor, draws: torch.Tensor, *, k: int, mode: str,
                    sampling: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        """spec_step.draft_chain over this object's draft_refresh and draft_next."""
        return draft_chain(model, head_cache, ref_hidden, ref_tokens, ref_count, draws, k=k, mode=mode,
                           sampling=sampling, refresh=self.draft_refresh, step=self.draft_next)

    def verify(self, model: CausalLM, cache: KVCache, ids: torch.Tensor, counts: torch.Tensor, is_draft: torch.Tensor,
               drafts: torch.Tensor, draft_probs: torch.Tensor, draws: torch.Tensor, *, k: int, mode: str,
               sampling: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        return verify(model, cache, ids, counts, is_draft, drafts, draft_probs, draws, k=k, mode=mode,
                      sampling=sampling)

    def spec_step(self, model: CausalLM, cache: KVCache, head_cache: KVCache, ref_hidden: torch.Tensor,
                  ref_tokens: torch.Tensor, ref_count: torch.Tensor, ids: torch.Tensor, counts: torch.Tensor,
                  is_draft: torch.Tensor, draws: torch.Tensor, *, k: int, mode: str,
                  sampling: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        """spec_step.speculative_step over this object's draft_chain and verify: a step drafting with the head."""
        return speculative_step(model, cache, head_cache, ref_hidden, ref_tokens, ref_count, ids, counts, is_draft,
                                draws, k=k, mode=mode, sampling=sampling, chain=self.draft_chain, check=self.verify)


EAGER = EagerSteps()


def _view(k: list[torch.Tensor], v: list[torch.Tensor], lengths: torch.Tensor, rope, linear) -> StaticView:
    """The cache as the graph sees it: `linear` (conv, recurrent, base, taken) for a hybrid trunk, else None."""
    return StaticView(k, v, lengths, rope) if linear is None else HybridStaticView(k, v, lengths, rope, *linear)


def _staged(view: StaticView):
    """What a hybrid chunk staged (returned by the graph for the host's rollback), else None."""
    return view.staged() if isinstance(view, HybridStaticView) else None


def _trunk(model: CausalLM, k, v, lengths, rope, linear, ids: torch.Tensor, counts: torch.Tensor):
    view = _view(k, v, lengths, rope, linear)
    same_rows(lengths, [ids, counts])
    return model(ids, view, counts), _staged(view)


def _head(model: CausalLM, k, v, lengths, rope, linear, *tensors):
    view = _view(k, v, lengths, rope, linear)
    same_rows(lengths, list(tensors))
    return head_forward(model, view, *tensors), None


def _refresh(model: CausalLM, k, v, lengths, rope, linear, *args):
    *tensors, mode, sampling = args
    view = _view(k, v, lengths, rope, linear)
    same_rows(lengths, tensors)
    return draft_refresh(model, view, *tensors, mode=mode, sampling=sampling), None


def _draft(model: CausalLM, k, v, lengths, rope, linear, *args):
    *tensors, depth, mode, sampling = args
    view = _view(k, v, lengths, rope, linear)
    same_rows(lengths, tensors)
    return draft_next(model, view, *tensors, depth=depth, mode=mode, sampling=sampling), None


def _verify(model: CausalLM, k, v, lengths, rope, linear, *args):
    *tensors, mode, sampling = args
    drafts = tensors[3]  # (R, k): k is its width, dynamic from 2 up
    view = _view(k, v, lengths, rope, linear)
    same_rows(lengths, tensors)
    return verify(model, view, *tensors, k=drafts.shape[1], mode=mode, sampling=sampling), _staged(view)


def _step(model: CausalLM, k, v, lengths, rope, linear, head_k, head_v, head_lengths, *args):
    """A whole speculative step (spec_step.speculative_step) over the trunk's and the head's caches: one graph per k."""
    *tensors, drafts_k, mode, sampling = args
    view, head = _view(k, v, lengths, rope, linear), StaticView(head_k, head_v, head_lengths, rope)
    same_rows(lengths, [head_lengths, *tensors])
    return speculative_step(model, view, head, *tensors, k=drafts_k, mode=mode, sampling=sampling), _staged(view)


class CompiledSteps(EagerSteps):
    """One model's compiled step functions; `failed` holds why compiling failed (then all runs eager)."""

    def __init__(self, model: CausalLM) -> None:
        self.graphs = {name: packaged(fn, model) for name, fn in
                       (("trunk", _trunk), ("head", _head), ("refresh", _refresh), ("draft", _draft),
                                   ("verify", _verify), ("step", _step))}
        self.failed: str | None = None
        self.calls: Counter[str] = Counter()  # calls that ran compiled: "trunk" (plain decoding, a prefill), "head" (a
        # prefill's head part), "refresh",
        # "draft" (one drafting forward), "verify", "step" (a whole speculative step)
        self.compile_s = 0.0  # seconds these steps spent compiling a graph or loading one (the warm-up)
        self.compile_new = True  # compile a graph no package holds (else that step runs eagerly)
        self.packed = graph_weights(model)  # which layers the graphs multiply by packed copies (prepared_steps)
        self.engine_call = next(_CALLS)  # the engine call these steps serve (prepared_steps): see run's trust

    def forward(self, model: CausalLM, ids: torch.Tensor, cache: KVCache, counts: torch.Tensor) -> torch.Tensor:
        """Compiled for a chunk of any length, a prefill's too (one graph for every length from 2 up). A hybrid's
        graphs are one per chunk length: its chunks of more than MAX_COMPILED_CHUNK tokens and its prefills (into a
        scratch cache that keeps no per-position states) run eager."""
        eager = lambda: super(CompiledSteps, self).forward(model, ids, cache, counts)  # noqa: E731
        hybrid_eager = isinstance(cache, HybridCache) and (ids.shape[1] > MAX_COMPILED_CHUNK or not cache.linear.snapshots)
        if self.failed or hybrid_eager:
            return eager()
        return self.run("trunk", eager, model, cache, ids.shape[1], ids, counts, dynamic_chunk=True)

    def head_forward(self, model: CausalLM, head_cache: KVCache, ref_hidden: torch.Tensor, ref_tokens: torch.Tensor,
                     ref_count: torch.Tensor) -> torch.Tensor:
        """One graph for every width from 2 up (a prefill's); width 1 runs eager."""
        eager = lambda: super(CompiledSteps, self).head_forward(  # noqa: E731
            model, head_cache, ref_hidden, ref_tokens, ref_count)
        if self.failed or ref_hidden.shape[1] < 2:
            return eager()
        return self.run("head", eager, model, head_cache, ref_hidden.shape[1], ref_hidden, ref_tokens, ref_count,
                        dynamic_chunk=True)

    def draft_refresh(self, model: CausalLM, head_cache: KVCache, ref_hidden: torch.Tensor, ref_tokens: torch.Tensor,
                      ref_count: torch.Tensor, draws: torch.Tensor, *, mode: str, sampling: SamplingParams):
        """One graph for every width from 2 to MAX_COMPILED_CHUNK (width 1 and a longer catch-up run eager)."""
        eager = lambda: super(CompiledSteps, self).draft_refresh(  # noqa: E731
            model, head_cache, ref_hidden, ref_tokens, ref_count, draws, mode=mode, sampling=sampling)
        if self.failed or not 1 < ref_hidden.shape[1] <= MAX_COMPILED_CHUNK:
            return eager()
        return self.run("refresh", eager, model, head_cache, ref_hidden.shape[1], ref_hidden, ref_tokens, ref_count,
                        draws, mode, sampling, dynamic_chunk=True)

    def draft_next(self, model: CausalLM, head_cache: KVCache, hidden: torch.Tensor, token: torch.Tensor,
                   draws: torch.Tensor, *, depth: int, mode: str, sampling: SamplingParams):
        """With one head layer every depth >= 2 is the same forward and one graph serves them all (with L layers, a
        depth matters mod L and through the entries it hides)."""
        depth = depth if model.require_mtp().num_layers > 1 else 2
        eager = lambda: super(CompiledSteps, self).draft_next(  # noqa: E731
            model, head_cache, hidden, token, draws, depth=depth, mode=mode, sampling=sampling)
        if self.failed:
            return eager()
        return self.run("draft", eager, model, head_cache, 1, hidden, token, draws, depth, mode, sampling)

    def verify(self, model: CausalLM, cache: KVCache, ids: torch.Tensor, counts: torch.Tensor, is_draft: torch.Tensor,
               drafts: torch.Tensor, draft_probs: torch.Tensor, draws: torch.Tensor, *, k: int, mode: str,
               sampling: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        """One graph for k = 0 (a plain step of a speculative run), one for k = 1 and one for every k from 2 (the
        chunk of k + 1 tokens, the drafts and the draws dynamic in k); an observation's longer chunk runs eager."""
        eager = lambda: super(CompiledSteps, self).verify(  # noqa: E731
            model, cache, ids, counts, is_draft, drafts, draft_probs, draws, k=k, mode=mode, sampling=sampling)
        if self.failed or ids.shape[1] != k + 1:
            return eager()
        return self.run("verify", eager, model, cache, ids.shape[1], ids, counts, is_draft, drafts, draft_probs, draws,
                        mode, sampling, dynamic_chunk=k > 1)

    def spec_step(self, model: CausalLM, cache: KVCache, head_cache: KVCache, ref_hidden: torch.Tensor,
                  ref_tokens: torch.Tensor, ref_count: torch.Tensor, ids: torch.Tensor, counts: torch.Tensor,
                  is_draft: torch.Tensor, draws: torch.Tensor, *, k: int, mode: str,
                  sampling: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        """One graph per k for a step whose trunk chunk is k + 1 tokens a row (every row drafting or stepping plainly),
        the refresh's width dynamic (a catch-up over any number of skipped steps); another step (an observation's
        chunk) runs the two verbs."""
        separate = lambda: super(CompiledSteps, self).spec_step(  # noqa: E731
            model, cache, head_cache, ref_hidden, ref_tokens, ref_count, ids, counts, is_draft, draws, k=k, mode=mode,
            sampling=sampling)
        width = ref_hidden.shape[1]
        if self.failed or not k or ids.shape[1] != k + 1:
            return separate()
        return self.run("step", separate, model, cache, k + 1, ref_hidden, ref_tokens, ref_count, ids, counts,
                        is_draft, draws, k, mode, sampling, dynamic_chunk=True,
                        head=(head_cache, width + k - 1))  # the refresh, then k - 1 drafting forwards

    def run(self, name: str, eager, model: CausalLM, cache: KVCache, chunk_len: int, *args,
            dynamic_chunk: bool = False, head: tuple[KVCache, int] | None = None) -> Any:
        """The graph `name`(model, views of the cache's used span, *args), the host span advanced as an eager forward does;
        `eager()` instead when compiling fails. `dynamic_chunk`: dimension 1 of the chunk's (B, T, ...) inputs is
        dynamic (one graph for every chunk length from 2 up). `head`: a second cache the graph writes (the head's, in
        a whole speculative step) and the positions it writes there; its views follow the trunk's linear states."""
        cache.check_room(chunk_len)
        capacity = cache.capacity
        if head is not None:
            head[0].check_room(head[1])
            capacity = max(capacity, head[0].capacity)
        args = tuple(_row_major(a) if isinstance(a, torch.Tensor) else a for a in args)
        cfg = model.config
        rope = rope_table(cfg.rotary_dim, cfg.rope_theta, model.dtype, model.device, capacity)  # built outside
        k, v = _span_views(cache, chunk_len)
        # a hybrid trunk's linear layers: their states (read), the chunk's bounds and the states it stages (written
        # in place: kept storage, which a graph allocating its own would map afresh each step)
        linear = ((cache.linear.conv, cache.linear.recurrent, cache.base, cache.taken, cache.linear.stagings(chunk_len))
                  if isinstance(cache, HybridCache) else None)
        head_views = (*_span_views(*head), head[0].lengths) if head is not None else ()
        batch1 = cache.batch_size == 1
        key = (model.dtype, model.state_dtype, batch1, "dynamic" if dynamic_chunk and chunk_len > 1 else chunk_len, self.packed,
               *(a for a in args if not isinstance(a, torch.Tensor)))  # the graph's candidates; its guards decide
        # within one engine call the model, its weights and the process's state stay as they are, and the cache's
        # buffers are the same: a call whose tensors have the shapes of the last call's that passed the graph's guards
        # (but for the span, within the classes the guards tell apart) passes them too (step_packages.PackagedGraph)
        trust = (self.engine_call, capacity, _span_class(cache.span + chunk_len, cache.capacity),
                 head and _span_class(head[0].span + head[1], head[0].capacity),
                 *(a.shape for a in args if isinstance(a, torch.Tensor)))
        try:
            dims = partial(_dynamic_dims, k, v, rope, cache, linear, head_views, args, dynamic_chunk and chunk_len > 1)
            ran = self.graphs[name](key, dims, self.compile_new, model, k, v, cache.lengths, rope, linear, *head_views,
                                    *args, trust=trust)
        except Exception as err:  # a compile failure: say it once, decode on eagerly
            if not isinstance(err, CompileFailed) and not _is_compile_error(err):
                raise
            self.failed = str(err) if isinstance(err, CompileFailed) else one_line(err)
            _say(f"compiling the decoding step failed ({self.failed})")
            return eager()
        if ran is None:  # no saved graph, and this run compiles none
            return eager()
        (out, staged), warmup = ran
        self.compile_s += warmup  # warm-up, not decoding
        if staged is not None:  # the hybrid chunk's per-position states: each row's are selected here
            assert isinstance(cache, HybridCache)
            cache.linear.windows, cache.linear.states, cache.linear.initials = (list(x) for x in staged)
            cache.linear.every_position = True
            cache.linear.select(cache.taken, cache.taken)
        cache.span += chunk_len
        if head is not None:
            head[0].span += head[1]
        self.calls[name] += 1
        return out


def _span_class(span: int, capacity: int) -> tuple[int, bool]:
    """What a graph's guards see of a cache view's span: whether it is 0, 1 or more (torch specialises 0 and 1) and
    whether it is the whole capacity (the view is then contiguous, and a graph guards on that)."""
    return min(span, 2), span == capacity


def _span_views(cache: KVCache, chunk_len: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Views of each layer's keys and values over the used span and the chunk's room: (B, Hkv, span, Dh) each,
    so the graph's writes land in the cache."""
    span = cache.span + chunk_len
    return [t[:, :, :span] for t in cache.k], [t[:, :, :span] for t in cache.v]


def _dynamic_dims(k, v, rope, cache: KVCache, linear, head_views: tuple, args: tuple, dynamic_chunk: bool) -> Dynamic:
    """The inputs' dimensions a graph leaves dynamic: every span (k, v and the head's), rope table size (it grows
    with the caches' capacity) and, above batch 1, the batch (torch specialises size 1, so batch 1 is its own
    graph); with `dynamic_chunk`, dimension 1 of a (B, T, ...) input: T, or k or k + 2 in a verify."""
    head_kv = [*head_views[0], *head_views[1]] if head_views else []
    dims: Dynamic = [(t, 2, True) for t in k + v + head_kv] + [(t, 0, True) for t in rope]
    staging = linear[4] if linear else []  # (T, B, Hv, Dk, Dv) a layer
    if cache.batch_size > 1:
        states = [*linear[0], *linear[1], *linear[2:4]] if linear else []
        head_all = [*head_kv, head_views[2]] if head_views else []
        dims += [(t, 0, True) for t in [*k, *v, cache.lengths, *states, *head_all,
                                        *(a for a in args if isinstance(a, torch.Tensor))]]
        dims += [(t, 1, True) for t in staging]
    if dynamic_chunk:
        dims += [(a, 1, False) for a in args if isinstance(a, torch.Tensor) and a.dim() >= 2]
        dims += [(t, 0, False) for t in staging]
    return dims


def _row_major(t: torch.Tensor) -> torch.Tensor:
    """`t` with row-major strides, copied only if it has others: a graph guards on its inputs' strides, even
    over dimensions of size 1 (a column of the step's draws, a slice of them, would each be a new graph)."""
    expected, stride = [], 1
    for size in reversed(t.shape):
        expected.append(stride)
        stride *= size
    if list(t.stride()) == expected[::-1]:
        return t
    return t.clone(memory_format=torch.contiguous_format)


def compile_seconds(model: CausalLM) -> float:
    """Seconds `model`'s compiled steps spent compiling so far (0 when it decodes eagerly)."""
    steps = _STEPS.get(model)
    return steps.compile_s if steps is not None else 0.0


def _is_compile_error(err: Exception) -> bool:
    """A failure to compile (dynamo, inductor, the C++ toolchain; torch.fx: a dimension marked dynamic that the
    graph specialised), not an error of the step itself."""
    return type(err).__module__.startswith(("torch._dynamo", "torch._inductor", "torch.fx", "subprocess"))


def _say(reason: str) -> None:
    print(f"bebop: --compile: {reason}; decoding runs eager", file=sys.stderr)
