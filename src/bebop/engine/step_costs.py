"""What a decoding step costs, as a function of live rows and drafts: profiled once, refined online.

    costs = step_costs(model, max_rows=64, max_k=6)   # profiled on first use, cached per model
    costs.predict(rows=32, k=3)                       # seconds of one step
    costs.observe(rows=32, k=3, seconds=0.021)        # a measured step refines that prediction

The prior is a profile of the two forwards a step is made of, timed on this machine with this
model when the engine first needs it (a scratch cache; a few dozen forwards): the trunk over
`rows x t` tokens (t = 1 for a plain step, k + 1 for a verify) and one MTP draft step over `rows`
tokens. A step with k drafts is predicted as

    trunk(rows, k + 1) + k * mtp(rows)     (the refresh over the last step's positions gives depth 1)

Everything else a step does (sampling, acceptance, drafting-loop bookkeeping) is learned from
measured steps: each live-rows bucket keeps two running ratios measured / profiled, one for plain
steps and one for drafting steps (every k shares it: the profile gives the shape in k, the ratio
the level; a bucket not measured yet starts from the nearest measured one). A ratio is a running
mean of log ratios in which one step moves the estimate by at most a factor
exp(MAX_JUMP) / (1 - RATIO_DECAY), so one step that the machine slowed down (these are shared
machines) cannot lock a bucket out of drafting. Nothing is hard-coded per machine.
"""

from __future__ import annotations

import math
import time
import weakref

import torch

from bebop.engine.metrics import rows_bucket
from bebop.model.kv_cache import KVCache
from bebop.model.qwen3 import CausalLM

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
    def __init__(self, trunk: dict[tuple[int, int], float], mtp: dict[int, float], max_k: int) -> None:
        self.trunk = trunk  # (rows, t) -> seconds of a trunk forward + LM head over rows x t tokens
        self.mtp = mtp  # rows -> seconds of one MTP draft step
        self.max_k = max_k
        self.log_ratio: dict[tuple[int, bool], float] = {}  # (rows bucket, drafting) -> log(measured / profiled)
        self._profiled: dict[tuple[int, int], float] = {}

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
        """Profiled seconds of a step: the verify forward and k draft steps (the first is the refresh,
        whose last position gives depth 1)."""
        key = (rows, k)
        if key not in self._profiled:  # the profile is fixed: interpolate once per (rows, k)
            self._profiled[key] = self.trunk_s(rows, k + 1) + k * self.mtp_s(rows)
        return self._profiled[key]

    def predict(self, rows: int, k: int) -> float:
        return self.profiled(rows, k) * math.exp(self.level(rows_bucket(rows), k > 0))

    def level(self, bucket: int, drafting: bool) -> float:
        """The bucket's log ratio for this kind of step, else the nearest measured bucket's, else 0."""
        own = self.log_ratio.get((bucket, drafting))
        if own is not None:
            return own
        near = [(abs(b - bucket), r) for (b, d), r in self.log_ratio.items() if d == drafting]
        return min(near)[1] if near else 0.0

    def has_measured(self, drafting: bool) -> bool:
        return any(d == drafting for _, d in self.log_ratio)

    def observe(self, rows: int, k: int, seconds: float) -> None:
        key = (rows_bucket(rows), k > 0)
        new = math.log(max(seconds, 1e-9) / max(self.profiled(rows, k), 1e-9))
        old = self.log_ratio.get(key)
        if old is not None:
            new = RATIO_DECAY * old + (1 - RATIO_DECAY) * min(max(new, old - MAX_JUMP), old + MAX_JUMP)
        self.log_ratio[key] = new


_CACHE: "weakref.WeakKeyDictionary[CausalLM, StepCosts]" = weakref.WeakKeyDictionary()


def step_costs(model: CausalLM, *, max_rows: int, max_k: int) -> StepCosts:
    """The model's profiled costs (cached per model object; re-profiled for a larger batch or K)."""
    costs = _CACHE.get(model)
    if costs is None or costs.max_k < max_k or max(r for r, _ in costs.trunk) < max_rows:
        costs = profile(model, max_rows=max_rows, max_k=max_k)
        _CACHE[model] = costs
    return costs


def profile_rows(max_rows: int) -> list[int]:
    rows = [1]
    while rows[-1] * 4 < max_rows:
        rows.append(rows[-1] * 4)
    return rows + [max_rows] if max_rows > 1 else rows


@torch.inference_mode()
def profile(model: CausalLM, *, max_rows: int, max_k: int) -> StepCosts:
    """Time trunk forwards at t = 1 and t = max_k + 1 and one MTP draft step, at a few row counts."""
    trunk, mtp = {}, {}
    for rows in profile_rows(max_rows):
        for t in (1, max_k + 1):
            trunk[(rows, t)] = _best_of(lambda: trunk_forward(model, rows, t))
        if model.mtp is not None:
            mtp[rows] = _best_of(lambda: mtp_step(model, rows))
    return StepCosts(trunk, mtp or {1: 0.0}, max_k)


def _best_of(run, repeats: int = 2) -> float:
    run()  # warm-up (allocations, kernel selection)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return min(times)


def trunk_forward(model: CausalLM, rows: int, t: int, context: int = PROFILE_CONTEXT,
                  cache: KVCache | None = None) -> None:
    """One cached trunk forward and LM head over rows x t new tokens after `context` cached positions
    (a decode step at t = 1, a verify of k drafts at t = k + 1), ending in the host sync a step pays.
    `cache`: a trunk cache of `rows` rows and capacity >= context + t to reuse (else one is made)."""
    cache = cache if cache is not None else model.new_cache(rows, context + t)
    cache.span = context
    cache.lengths.fill_(context)
    ids = torch.zeros(rows, t, dtype=torch.long, device=model.device)  # (R, t)
    hidden = model(ids, cache)  # (R, t, H)
    model.logits(hidden).sum().item()  # the host sync a step pays


def mtp_step(model: CausalLM, rows: int, context: int = PROFILE_CONTEXT, cache: KVCache | None = None) -> None:
    """One cached MTP draft step (depth 2: one layer) over `rows` rows and its draft distribution.
    `cache`: a head cache of `rows` rows and capacity >= context + 1 to reuse (else one is made)."""
    mtp = model.require_mtp()
    cache = cache if cache is not None else mtp.new_cache(rows, context + 1, dtype=model.dtype, device=model.device)
    cache.span = context
    cache.lengths.fill_(context)
    ids = torch.zeros(rows, 1, dtype=torch.long, device=model.device)  # (R, 1)
    hidden = torch.zeros(rows, 1, model.config.hidden_size, dtype=model.dtype, device=model.device)  # (R, 1, H)
    out = mtp(hidden, model.embed(ids), 2, cache, torch.ones(rows, dtype=torch.long, device=model.device))
    torch.softmax(model.mtp_logits(out[:, 0]), -1).sum().item()
