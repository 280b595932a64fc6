"""Where a decoding step's time goes: verify forward, MTP forwards, sampling and acceptance, cache work
and the rest, for plain decoding and speculative steps (fixed K and --k auto) at a few live-row counts.

    python benchmarks/step_profile.py --model DIR [--cases 1,8,64,longtail] [--arms plain,rs:3,rs:auto]
                                      [--tokens 64] [--runs 3] [--out FILE.jsonl]

A case is a number of rows decoding exactly --tokens new tokens each (no stop: every step has that many
live rows), or `longtail`: 64 task prompts stopping at their stop tokens, up to 384 new tokens (the RL
config's lengths; meaningful with a trained policy). Each function of a category is wrapped by a timer
(the outermost timed call owns the time, so nothing counts twice); a step runs from one speculative
`_SpeculativeRun.step` (plain: one trunk forward) to the next. Per (case, arm) one JSON line: ms per decode step for
each category, the median over --runs after a warm-up run; the prompts' prefill (in a tree before the
engine's prefill verb: the first step, which fed the prompts) apart as `prefill_ms`; `forwards_ms` = verify +
MTP, and `step_over_forwards`, a step over its forwards. "verify_forward" is the trunk forward (plain: the decode forward) with
everything inside it: cache writes, the mask, attention. `--compile on` profiles the compiled steps (the
trunk timed where the engine calls it; "mtp_forwards" is then the whole drafting function, its warps and
draws included; "whole_step" a drafting step run as one graph, counted with the forwards). Its graphs are kept in
a store of their own (`bebop-step-profile` beside the user's, unless $BEBOP_COMPILE_CACHE names one): traced
through the timers, they guard on them, and a process without the timers would have to compile them again.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import time
from collections import defaultdict
from contextlib import contextmanager

import torch

from bebop.engine import compiled, refresh_log, speculative, step_packages
from bebop.engine.compiled import compile_steps
from bebop.engine.generate import generate
from bebop.engine.speculative import speculative_generate
from bebop.model import kv_cache, qwen3
from bebop.model.mtp import MTPHead
from bebop.policy import load_policy
from bebop.sampling import SamplingParams
from bebop.tasks import get_task

from common import machine, median

plain_module = importlib.import_module("bebop.engine.generate")  # the module (bebop.engine.generate is the function)

spec_step = importlib.import_module("bebop.engine.spec_step") if importlib.util.find_spec("bebop.engine.spec_step") \
    else None  # the step's verbs as tensor functions (absent in a tree before them)
# the step functions' classes (engine/compiled.py), where the tree has them (before: module functions)
STEP_CLASSES = [getattr(compiled, name) for name in ("EagerSteps", "CompiledSteps") if hasattr(compiled, name)]
RUN = getattr(speculative, "_SpeculativeRun", None) or speculative._Run  # per-call state (older name: a tree before)
SAMPLING = ("warp_probs", "sample", "entropy", "to_host", "_accept", "token_logprob", "_pick",
            "_rejection_sample_from", "_target_only_sample_from")

# category -> [(owner, attribute name)]: the functions whose time is that category's (a name a tree lacks is skipped)
CATEGORIES = {
    "verify_forward": [(qwen3.CausalLM, "forward"), (qwen3.CausalLM, "logits")],
    "mtp_forwards": [(MTPHead, "forward"), (qwen3.CausalLM, "mtp_logits"), (qwen3.CausalLM, "embed")],
    "sampling_acceptance": [(mod, name) for mod in (speculative, plain_module, spec_step) if mod for name in SAMPLING],
    "cache_work": [(refresh_log.RefreshLog, "take"), (refresh_log.RefreshLog, "add"), (refresh_log.RefreshLog, "keep"),
                   (kv_cache.KVCache, "rollback"), (kv_cache.KVCache, "keep"), (RUN, "_leave_finished"),
                   (plain_module, "_leave_finished"), (plain_module, "pad_chunk"), (speculative, "pad_chunk")],
    "whole_step": [],  # compiled only: a drafting step as one graph (below)
}

# with --compile on, nothing a compiled graph calls may be wrapped (a timer is a graph break): the trunk is timed
# at the engine's call (compiled or not; a speculative step's verify graph holds its warps and acceptance too),
# and the whole drafting function (refresh, chain, its warps and draws) is "mtp_forwards"
COMPILED_CATEGORIES = {
    **CATEGORIES,
    "verify_forward": [(plain_module, "trunk_forward"), (speculative, "trunk_forward"), (speculative, "verify_step"),
                       *[(steps, name) for steps in STEP_CLASSES for name in ("forward", "verify")],
                       (qwen3.CausalLM, "logits")],
    "mtp_forwards": [(speculative, "_draft")],
    # a drafting step run whole (its forwards, warps, draws and acceptance in one graph), where the tree has it
    "whole_step": [(steps, "spec_step") for steps in STEP_CLASSES],
    "sampling_acceptance": [(mod, name) for mod in (speculative, plain_module) for name in SAMPLING],
}
# the engine's prefill (each distinct prompt once, before the first step) where the tree has one: it is "step 0",
# reported as prefill_ms; in an older tree the first step fed the whole prompt and was step 0
PREFILL = [(plain_module, "prefill_prompts"), (speculative, "prefill_prompts")]
STEP_STARTS = {(qwen3.CausalLM, "forward"), (plain_module, "trunk_forward"),  # plain decoding: one per step
               *((steps, "forward") for steps in STEP_CLASSES)}


class Timers:
    """Seconds per (step, category); only the outermost timed call is counted. A step starts at each
    speculative `_SpeculativeRun.step`, or for plain decoding at each trunk forward (its one forward per step)."""

    def __init__(self, plain: bool) -> None:
        self.seconds: dict[tuple[int, str], float] = defaultdict(float)
        self.starts: list[float] = []  # each step's start (perf_counter)
        self.depth = 0
        self.plain = plain

    def wrap(self, category: str, fn, starts_step: bool = False, always: bool = False):
        def timed(*args, **kwargs):
            if self.depth:
                return fn(*args, **kwargs)
            self.depth += 1
            start = time.perf_counter()
            if starts_step and (self.plain or always):
                self.starts.append(start)
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[(len(self.starts) - 1, category)] += time.perf_counter() - start
                self.depth -= 1
        return timed


@contextmanager
def instrumented(timers: Timers):
    """Every category's functions wrapped; speculative steps mark their starts."""
    saved = []
    for category, places in (COMPILED_CATEGORIES if ARGS.compile == "on" else CATEGORIES).items():
        for owner, name in places:
            if not hasattr(owner, name):
                continue
            real = getattr(owner, name)
            saved.append((owner, name, real))
            setattr(owner, name, timers.wrap(category, real, starts_step=(owner, name) in STEP_STARTS))
    for owner, name in PREFILL:
        if hasattr(owner, name):
            saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, timers.wrap("prefill", getattr(owner, name), starts_step=True, always=True))
    head_draft = getattr(speculative, "_HEAD_DRAFT", None)  # the engine runs a step whole while _draft is this
    if head_draft is not None:
        speculative._HEAD_DRAFT = speculative._draft  # wrapped or not: timing must not change the path
    real_step = RUN.step

    def step(run):
        timers.starts.append(time.perf_counter())
        real_step(run)

    RUN.step = step
    try:
        yield
    finally:
        RUN.step = real_step
        if head_draft is not None:
            speculative._HEAD_DRAFT = head_draft
        for owner, name, real in reversed(saved):
            setattr(owner, name, real)


def prompts_for(policy, case: str, task: str) -> tuple[list[list[int]], int, tuple[int, ...]]:
    """(prompts, max_new_tokens, stop ids) of a case."""
    rows = 64 if case == "longtail" else int(case)
    problems = get_task(task).problems("test", rows, 0)
    ids = [policy.codec.encode(p.prompt) for p in problems]
    return (ids, 384, policy.stop_ids) if case == "longtail" else (ids, ARGS.tokens, ())


def run_once(policy, arm: str, prompts, max_new: int, stops) -> dict:
    """ms per decode step for each category (the prompt's step, a prefill, reported apart as prefill_ms)."""
    timers = Timers(plain=arm == "plain")
    g = torch.Generator().manual_seed(0)
    common = dict(max_new_tokens=max_new, sampling=SamplingParams(ARGS.temperature), stop_ids=stops, generator=g,
                  pad_id=policy.pad_id)
    with instrumented(timers):
        if arm == "plain":
            gens = generate(policy.model, prompts, **common)
        else:
            mode, k = arm.split(":")
            gens, _ = speculative_generate(policy.model, prompts, k=k if k == "auto" else int(k), mode=mode, **common)
        end = time.perf_counter()
    bounds = timers.starts + [end]
    steps = len(timers.starts) - 1  # decode steps, after the prefill
    out = {name: 1e3 * sum(timers.seconds[(i, name)] for i in range(1, steps + 1)) / steps for name in CATEGORIES}
    out["step_ms"] = 1e3 * (bounds[-1] - bounds[1]) / steps
    out["rest"] = out["step_ms"] - sum(out[name] for name in CATEGORIES)
    out["prefill_ms"] = 1e3 * (bounds[1] - bounds[0])
    out["steps"] = steps
    out["tokens"] = sum(len(gen.token_ids) for gen in gens)
    return out


def profile(policy, case: str, arm: str) -> dict:
    prompts, max_new, stops = prompts_for(policy, case, ARGS.task)
    run_once(policy, arm, prompts, max_new, stops)  # warm-up (and --k auto's cost profile)
    runs = [run_once(policy, arm, prompts, max_new, stops) for _ in range(ARGS.runs)]
    row = {key: median([r[key] for r in runs]) for key in runs[0]}
    row["forwards_ms"] = row["verify_forward"] + row["mtp_forwards"] + row["whole_step"]
    row["step_over_forwards"] = row["step_ms"] / row["forwards_ms"]
    return {"case": case, "arm": arm, "compile": ARGS.compile, **{k: round(v, 3) for k, v in row.items()}}


def main() -> None:
    if ARGS.compile == "on":  # graphs traced through the timers guard on them: kept apart from a user's store
        os.environ.setdefault(step_packages.STORE_ENV, str(step_packages.default_store_root().with_name(
            "bebop-step-profile")))
    policy = load_policy(ARGS.model, device="cpu")
    compile_steps(policy.model, ARGS.compile)  # on: the warm-up run compiles
    rows = [profile(policy, case, arm) for case in ARGS.cases.split(",") for arm in ARGS.arms.split(",")]
    lines = [json.dumps(row) for row in rows] + [json.dumps({"machine": machine(), "model": ARGS.model})]
    print("\n".join(lines))
    if ARGS.out:
        with open(ARGS.out, "a") as fh:
            fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--cases", default="1,8,64,longtail")
    parser.add_argument("--arms", default="plain,rs:3,rs:auto")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--task", default="math")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--compile", choices=("on", "off"), default="off", help="compiled decoding steps")
    parser.add_argument("--out")
    ARGS = parser.parse_args()
    main()
