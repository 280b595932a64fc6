"""What a decoding step costs, as a function of live rows and drafts: profiled once, refined online.

    costs = step_costs(model, max_rows=64, max_k=6)   # profiled on first use, cached per model
    costs.predict(rows=32, k=3)                       # seconds of one step
    costs.observe(rows=32, k=3, seconds=0.021)        # a measured step refines that prediction

The prior is a profile of the steps, timed on this machine with this model when the engine first
needs it (scratch caches; a few dozen calls), through the very functions the engine runs
(bebop.engine.compiled: compiled graphs when the model's steps are compiled, so the profile also
compiles them before decoding starts): a plain step (the trunk over one token a row, the LM head, warp and
draw) and, with a head, the whole drafting step at every k up to max-k (its refresh over k + 1 positions,
its k drafts, the verify: one graph when compiled); where drafts may come from the rollouts' text, also
the verify over `rows x (k + 1)` tokens at every k and the head's drafting forward. Each runs over caches
made before the timings (a cache's allocation is no part of a step), and only what the run will call is
timed, so a compiled profile compiles no graph the run does not need. A
step with k drafts is predicted as its profiled whole step; drafts that cost no forward (the rollouts'
own text) as the verify alone; a table without whole steps as

    trunk(rows, k + 1) + k * mtp(rows)     (the refresh over the last step's positions gives depth 1)

Everything else a step does (the host's bookkeeping, the drafting loop) is learned from
measured steps: each live-rows bucket keeps two running ratios measured / profiled, one for plain
steps and one for drafting steps (every k shares it: the profile gives the shape in k, the ratio
the level; a bucket not measured yet starts from the nearest measured one). A ratio is a running
mean of log ratios in which one step moves the estimate by at most a factor
exp(MAX_JUMP) / (1 - RATIO_DECAY), so one step that the machine slowed down (these are shared
machines) cannot lock a bucket out of drafting. Nothing is hard-coded per machine.

The table (the profile and the learned ratios, per model kind, run mode, sampling, compiled or eager steps) is
kept in the compile store beside the model kind's graphs (engine/step_packages.py): a later process starts from
it instead of profiling again, with the ratios the runs before it measured; each refining `--k auto` call writes
it back, atomically. A controller that does not refine (`--k-costs fixed`) chooses from the table alone, so a
rerun with the same table and seed makes the same choices.
"""

from __future__ import annotations

import json
import math
import time
import weakref
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from bebop.engine.compiled import is_compiled, prepared_steps, steps_of
from bebop.engine.metrics import rows_bucket
from bebop.engine.step_packages import kind_file
from bebop.fileio import atomic_write_text
from bebop.model.kv_cache import KVCache
from bebop.model.packed_linear import decoding
from bebop.model.qwen3 import CausalLM
from bebop.sampling import SamplingParams

PROFILE_CONTEXT = 64  # cached positions the profiled forwards attend over
RATIO_DECAY = 0.8  # weight of the old log ratio when a new step is measured
MAX_JUMP = 0.5  # a measured log ratio is clipped to the estimate +- this before it is averaged in


def _interp(points: list[tuple[int, float]], x: float) -> float:
    """Piecewise-linear interpolation over sorted (x, y) points, linear extrapolation past the ends."""
    if len(points) == 1:
        return points[0][1] * max(x, 1) / max(points[0][0], 1)
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1 or (x1, y1) == points[-1]:
            return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))
    raise AssertionError("unreachable")


class StepCosts:
    def __init__(self, trunk: dict[tuple[int, int], float], mtp: dict[int, float], max_k: int,
                 step: dict[tuple[int, int], float] | None = None) -> None:
        self.trunk = trunk  # (rows, t) -> seconds of a trunk forward + LM head over rows x t tokens
        self.mtp = mtp  # rows -> seconds of one MTP draft step
        self.step = step or {}  # (rows, k) -> seconds of a whole drafting step with the head, where profiled
        self.max_k = max_k
        self.log_ratio: dict[tuple[int, bool], float] = {}  # (rows bucket, drafting) -> log(measured / profiled)
        self.measured: Counter[tuple[int, bool]] = Counter()  # steps this process measured (not read) per key
        self.lowest: dict[tuple[int, bool], float] = {}  # the lowest log ratio one of them measured
        self._profiled: dict[tuple[int, int], float] = {}
        self.compiled = False  # profiled through compiled steps
        self.table: Path | None = None  # where `save` keeps it (the compile store), else not kept

    @property
    def verifies_drafts(self) -> bool:
        """Whether the verify was profiled with drafts (k >= 1), not only as a plain step: what drafts that are no
        whole step with the head (the rollouts' text) are priced by."""
        return any(t > 1 for _, t in self.trunk)

    def covers(self, max_rows: int, max_k: int, compiled: bool, text_drafts: bool = False) -> bool:
        """Whether this profile serves a run of up to `max_rows` rows and `max_k` drafts on these steps; `text_drafts`:
        a run whose drafts may come from the rollouts' text (then the verify with drafts must be profiled)."""
        return (self.max_k >= max_k and max(r for r, _ in self.trunk) >= max_rows and self.compiled == compiled
                and (self.verifies_drafts or not text_drafts))

    def to_dict(self) -> dict[str, Any]:
        return {"max_k": self.max_k, "compiled": self.compiled,
                "trunk": [[r, t, s] for (r, t), s in sorted(self.trunk.items())],
                "mtp": [[r, s] for r, s in sorted(self.mtp.items())],
                "step": [[r, k, s] for (r, k), s in sorted(self.step.items())],
                "log_ratio": [[b, d, v] for (b, d), v in sorted(self.log_ratio.items())]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepCosts:
        costs = cls({(int(r), int(t)): float(s) for r, t, s in data["trunk"]},
                    {int(r): float(s) for r, s in data["mtp"]}, int(data["max_k"]),
                    {(int(r), int(k)): float(s) for r, k, s in data["step"]})
        costs.compiled = bool(data["compiled"])
        costs.log_ratio = {(int(b), bool(d)): float(v) for b, d, v in data["log_ratio"]}
        seconds = [*costs.trunk.values(), *costs.mtp.values(), *costs.step.values()]
        rows = {r for r, _ in costs.trunk}
        widths = range(1, costs.max_k + 2) if costs.verifies_drafts else range(1, 2)
        if (not all(math.isfinite(x) and x >= 0 for x in seconds) or not all(map(math.isfinite, costs.log_ratio.values()))
                or {(r, t) for r in rows for t in widths} - set(costs.trunk)
                or (not costs.step and not costs.verifies_drafts)
                or (costs.step and {(r, k) for r in rows for k in range(1, costs.max_k + 1)} - set(costs.step))):
            raise ValueError("a cost table with missing or negative timings")
        return costs

    def save(self) -> None:
        """Write the table where it is kept (nothing when it is not); a store that cannot be written keeps it in
        this process only (engine/step_packages.py says so once for the graphs)."""
        if self.table is not None:
            try:
                atomic_write_text(self.table, json.dumps(self.to_dict()))
            except OSError:
                pass

    def trunk_s(self, rows: int, t: int) -> float:
        """Profiled seconds of a trunk forward (and LM head) over `t` tokens in each of `rows` rows."""
        widths = sorted({w for _, w in self.trunk})
        by_width = [(w, _interp(sorted((r, s) for (r, ww), s in self.trunk.items() if ww == w), rows))
                    for w in widths]
        return _interp(by_width, t)

    def mtp_s(self, rows: int) -> float:
        """Profiled seconds of one MTP draft step over `rows` rows."""
        return _interp(sorted(self.mtp.items()), rows)

    def profiled(self, rows: int, k: int) -> float:
        """Profiled seconds of a step: the whole drafting step where it was profiled, else the verify forward and
        k draft steps (the first is the refresh, whose last position gives depth 1)."""
        key = (rows, k)
        if key not in self._profiled:  # the profile is fixed: interpolate once per (rows, k)
            if k and self.step:
                self._profiled[key] = _interp(sorted((r, s) for (r, kk), s in self.step.items() if kk == k), rows)
            else:
                self._profiled[key] = self.trunk_s(rows, k + 1) + k * self.mtp_s(rows)
        return self._profiled[key]

    def predict(self, rows: int, k: int, lowest: bool = False) -> float:
        """Seconds of a step; `lowest`: at the lowest ratio this process measured for its bucket and kind (the
        best case its own steps showed), where it has one."""
        key = (rows_bucket(rows), k > 0)
        level = self.lowest[key] if lowest and key in self.lowest else self.level(*key)
        return self.profiled(rows, k) * math.exp(level)

    def level(self, bucket: int, drafting: bool) -> float:
        """The bucket's log ratio for this kind of step, else the nearest measured bucket's, else 0."""
        own = self.log_ratio.get((bucket, drafting))
        if own is not None:
            return own
        near = [(abs(b - bucket), r) for (b, d), r in self.log_ratio.items() if d == drafting]
        return min(near)[1] if near else 0.0

    def measured_here(self, bucket: int, drafting: bool, at_least: int = 1) -> bool:
        """Whether this live-batch bucket has measured `at_least` steps of this kind in this process (its level is
        its own, not borrowed, nor read from a table another process measured)."""
        return self.measured[(bucket, drafting)] >= at_least

    def has_measured(self, drafting: bool) -> bool:
        """Whether a step of this kind was measured in this process."""
        return any(d == drafting and n for (_, d), n in self.measured.items())

    def has_level(self, drafting: bool) -> bool:
        """Whether any level of this kind is known: measured here or read from the table."""
        return any(d == drafting for _, d in self.log_ratio)

    def observe(self, rows: int, k: int, seconds: float | None) -> None:
        """A measured step of `rows` rows and k drafts; `seconds` None: counted, its time not used (a controller
        that prices steps by the table alone)."""
        key = (rows_bucket(rows), k > 0)
        if seconds is not None:
            new = math.log(max(seconds, 1e-9) / max(self.profiled(rows, k), 1e-9))
            self.lowest[key] = min(new, self.lowest.get(key, new))
            old = self.log_ratio.get(key) if self.measured[key] else None  # a table's level gives way to the first own
            if old is not None:
                new = RATIO_DECAY * old + (1 - RATIO_DECAY) * min(max(new, old - MAX_JUMP), old + MAX_JUMP)
            self.log_ratio[key] = new
        self.measured[key] += 1


_CACHE: "weakref.WeakKeyDictionary[CausalLM, StepCosts]" = weakref.WeakKeyDictionary()


def step_costs(model: CausalLM, *, max_rows: int, max_k: int, mode: str = "rs",
               sampling: SamplingParams = SamplingParams(1.0), text_drafts: bool = False) -> StepCosts:
    """The model's profiled costs (cached per model object; re-profiled for a larger batch or K, for drafts from the
    text, or once its steps are compiled; read from and kept in the compile store). `mode`, `sampling`: the run's,
    so that a compiled profile warms the graphs it will use; `text_drafts`: drafts may come from the rollouts'
    text (the verify with drafts is profiled, and the head's two verbs where there is a head)."""
    costs, compiled = _CACHE.get(model), is_compiled(model)
    if costs is None or not costs.covers(max_rows, max_k, compiled, text_drafts):
        table = kind_file(model, f"costs-{mode}-{'compiled' if compiled else 'eager'}", repr(sampling), ".json")
        costs = load_costs(table)
        if costs is None or not costs.covers(max_rows, max_k, compiled, text_drafts):
            costs = profile(model, max_rows=max_rows, max_k=max_k, mode=mode, sampling=sampling,
                            text_drafts=text_drafts or model.mtp is None)
            costs.table = table
            costs.save()
        _CACHE[model] = costs
    return costs


def drafter_costs(model: CausalLM, drafter: str, *, max_rows: int, max_k: int, mode: str,
                  sampling: SamplingParams) -> StepCosts:
    """The costs `--k auto` prices a run of `drafter` ("mtp", "suffix", "both") by: the head's whole drafting steps,
    the verify with drafts that cost no forward (the text's), or both."""
    costs = step_costs(model, max_rows=max_rows, max_k=max_k, mode=mode, sampling=sampling,
                       text_drafts=drafter != "mtp")
    return without_head(costs) if drafter == "suffix" else costs


def load_costs(table: Path) -> StepCosts | None:
    """The cost table saved at `table`, or None where there is none or it cannot be read (it is profiled again)."""
    try:
        costs = StepCosts.from_dict(json.loads(table.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    costs.table = table
    return costs


def without_head(costs: StepCosts) -> StepCosts:
    """The same verify costs with a free drafter (drafts from the rollouts' text: no head forward), corrected by
    its own measured steps."""
    out = StepCosts(costs.trunk, {rows: 0.0 for rows in costs.mtp}, costs.max_k)
    out.compiled = costs.compiled
    return out


def profile_rows(max_rows: int) -> list[int]:
    rows = [1]
    while rows[-1] * 4 < max_rows:
        rows.append(rows[-1] * 4)
    return rows + [max_rows] if max_rows > 1 else rows


@torch.inference_mode()
@decoding()
def profile(model: CausalLM, *, max_rows: int, max_k: int, mode: str = "rs",
            sampling: SamplingParams = SamplingParams(1.0), text_drafts: bool = True) -> StepCosts:
    """Time a plain step and, with a head, the whole drafting step at every k from 1 to max_k, at a few row counts,
    through the functions the engine runs (compiled when the model's steps are: this compiles their graphs before
    decoding starts, so no decoding step pays for one). `text_drafts`: also the verify at every k (drafts from the
    rollouts' text) and, with a head, one drafting forward and its refresh (the two verbs a step mixing the head's
    drafts with the text's runs). The caches are made once per row count, outside the timings: a step allocates
    none."""
    prepared_steps(model)  # the graphs' packed weight copies made current once, outside the timings, as a run does
    trunk, mtp, step = {}, {}, {}
    for rows in profile_rows(max_rows):
        cache = model.new_cache(rows, 2 * PROFILE_CONTEXT + max_k + 1)  # room past the span, as in a run
        for t in range(1, max_k + 2 if text_drafts else 2):
            trunk[(rows, t)] = _best_of(lambda: trunk_forward(model, rows, t, cache=cache, mode=mode,
                                                              sampling=sampling))
        if model.mtp is not None:
            head = _head_cache(model, rows, PROFILE_CONTEXT, max_k + 1, None)
            if text_drafts:
                mtp[rows] = _best_of(lambda: mtp_step(model, rows, cache=head, mode=mode, sampling=sampling))
                refresh(model, rows, max_k + 1, mode=mode, sampling=sampling)  # its graph compiled, not timed
            for k in range(1, max_k + 1):
                step[(rows, k)] = _best_of(lambda: whole_step(model, rows, k, cache=cache, head=head, mode=mode,
                                                              sampling=sampling))
    costs = StepCosts(trunk, mtp or {1: 0.0}, max_k, step)
    costs.compiled = is_compiled(model)
    return costs


def _best_of(run, repeats: int = 3) -> float:
    run()  # warm-up (allocations, kernel selection, a compile)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return min(times)


def trunk_forward(model: CausalLM, rows: int, t: int, context: int = PROFILE_CONTEXT, cache: KVCache | None = None,
                  *, mode: str = "rs", sampling: SamplingParams = SamplingParams(1.0)) -> None:
    """One speculative verify over rows x t tokens after `context` cached positions (t = 1: a plain step, k = 0;
    else k = t - 1 drafts), as the engine runs it (the model's steps' verify (bebop.engine.compiled): the trunk forward, the LM
    head, warps, acceptance), ending in the host read a step pays.
    `cache`: a trunk cache of `rows` rows and capacity >= context + t to reuse (else one is made)."""
    cache = cache if cache is not None else model.new_cache(rows, 2 * context + t)  # room past the span, as in a run
    cache.span = context
    cache.lengths.fill_(context)
    device, k, vocab = model.device, t - 1, model.config.vocab_size
    ids = torch.zeros(rows, t, dtype=torch.long, device=device)  # (R, t)
    counts = torch.full((rows,), t, dtype=torch.long, device=device)  # (R,)
    drafting = torch.full((rows,), k > 0, device=device)  # (R,)
    drafts = torch.zeros(rows, k, dtype=torch.long, device=device)  # (R, k)
    draft_probs = torch.full((rows, k, vocab), 1.0 / vocab, device=device)  # (R, k, V)
    draws = torch.full((rows, k + 2), 0.5, dtype=torch.float64, device=device)  # (R, k + 2)
    _, host = steps_of(model).verify(model, cache, ids, counts, drafting, drafts, draft_probs, draws, k=k, mode=mode,
                                     sampling=sampling)
    host.tolist()  # the host read a step pays


def whole_step(model: CausalLM, rows: int, k: int, context: int = PROFILE_CONTEXT, *, cache: KVCache,
               head: KVCache, mode: str = "rs", sampling: SamplingParams = SamplingParams(1.0)) -> None:
    """One drafting step over `rows` rows with k drafts after `context` cached positions, as the engine runs a
    decode step (its steps' spec_step: the head's refresh over k + 1 positions, its drafts, the verify over k + 1
    tokens, the acceptance), ending in the host read. `cache`, `head`: a trunk and a head cache of `rows` rows with
    room for context + k + 1 and context + 2k positions."""
    cache.span = context
    cache.lengths.fill_(context)
    head = _head_cache(model, rows, context, 2 * k, head)
    device, width = model.device, k + 1
    ref_hidden = torch.zeros(rows, width, model.config.hidden_size, dtype=model.dtype, device=device)  # (R, k+1, H)
    ref_tokens = torch.zeros(rows, width, dtype=torch.long, device=device)  # (R, k+1)
    ref_count = torch.ones(rows, dtype=torch.long, device=device)  # (R,): the last step's one position, padded
    ids = torch.zeros(rows, width, dtype=torch.long, device=device)  # (R, k+1)
    counts = torch.full((rows,), width, dtype=torch.long, device=device)  # (R,)
    drafting = torch.ones(rows, dtype=torch.bool, device=device)  # (R,)
    draws = torch.full((rows, 2 * k + 2), 0.5, dtype=torch.float64, device=device)  # (R, 2k + 2)
    _, host = steps_of(model).spec_step(model, cache, head, ref_hidden, ref_tokens, ref_count, ids, counts, drafting,
                                        draws, k=k, mode=mode, sampling=sampling)
    host.tolist()  # the host read a step pays


def _head_cache(model: CausalLM, rows: int, context: int, width: int, cache: KVCache | None) -> KVCache:
    mtp = model.require_mtp()
    cache = cache if cache is not None else mtp.new_cache(rows, 2 * context + width, dtype=model.dtype,
                                                          device=model.device)  # room past the span, as in a run
    cache.span = context
    cache.lengths.fill_(context)
    return cache


def mtp_step(model: CausalLM, rows: int, context: int = PROFILE_CONTEXT, cache: KVCache | None = None,
             *, mode: str = "rs", sampling: SamplingParams = SamplingParams(1.0)) -> None:
    """One cached drafting forward (depth 2) over `rows` rows, its warp and draw, as the engine runs it
    (its steps' draft_next, bebop.engine.compiled). `cache`: a head cache of `rows` rows and capacity >= context + 1
    to reuse (else one is made)."""
    cache = _head_cache(model, rows, context, 1, cache)
    hidden = torch.zeros(rows, model.config.hidden_size, dtype=model.dtype, device=model.device)  # (R, H)
    token = torch.zeros(rows, dtype=torch.long, device=model.device)  # (R,)
    draws = torch.full((rows,), 0.5, dtype=torch.float64, device=model.device)  # (R,)
    _, drafted, _ = steps_of(model).draft_next(model, cache, hidden, token, draws, depth=2, mode=mode,
                                               sampling=sampling)
    drafted.tolist()


def refresh(model: CausalLM, rows: int, width: int, context: int = PROFILE_CONTEXT, *, mode: str = "rs",
            sampling: SamplingParams = SamplingParams(1.0)) -> None:
    """One refresh of the head's cache over `width` positions a row (its steps' draft_refresh)."""
    cache = _head_cache(model, rows, context, width, None)
    hidden = torch.zeros(rows, width, model.config.hidden_size, dtype=model.dtype, device=model.device)  # (R, W, H)
    tokens = torch.zeros(rows, width, dtype=torch.long, device=model.device)  # (R, W)
    count = torch.full((rows,), width, dtype=torch.long, device=model.device)  # (R,)
    draws = torch.full((rows,), 0.5, dtype=torch.float64, device=model.device)  # (R,)
    steps_of(model).draft_refresh(model, cache, hidden, tokens, count, draws, mode=mode, sampling=sampling)[1].tolist()
