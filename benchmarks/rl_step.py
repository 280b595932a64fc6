"""GRPO step time: sync vs async, speculation off vs on, and how async splits the cores between the
rollout worker and the trainer.

    python benchmarks/rl_step.py --model DIR [--steps 6] [--runs sync:off,sync:rs,async:rs@1/1,async:rs@0/0]
                                 [--k auto] [--group-size 8] [--batch-prompts 8] [--max-new-tokens 384]
                                 [--difficulty 2]   # the demo's long-response configuration (3: longer still)

DIR is a policy with a trained MTP head. A run is MODE:SPEC[@ROLLOUT_THREADS/TRAIN_THREADS][+OPTION...]
(0 = torch's default, every core; an OPTION is `compile` (--compile on), `vllm` (--engine vllm, with vLLM's
Python in BEBOP_VLLM_PYTHON), `suffix` or `both` (--drafter), `kN` (this run's --k), `rollout-bfloat16`
(--rollout-dtype) or the training precision, float32 or bfloat16). To compare revisions, run this script alternately with
PYTHONPATH=WORKTREE/src (runs without options pass none, so an older bebop runs them too).
Each run trains --steps GRPO steps from the same policy and seed
into a temporary directory; its step time is the median over the steps after the first (which
pays first-call costs: the cost profile, allocations). Prints one JSON line per run with the step
split and the speedup of its median step over the first run's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from bebop.engine.speculative import parse_k
from bebop.rl import RLConfig, train_rl

try:
    from bebop.fields import from_flat
except ImportError:  # a tree before the decoding settings were nested (--before runs)
    def from_flat(cls, values):
        return cls(**values)

from common import machine


def parse_run(text: str) -> dict:
    head, *options = text.split("+")
    name, _, threads = head.partition("@")
    mode, spec = name.split(":")
    rollout, train = (int(x) for x in threads.split("/")) if threads else (0, 0)
    extra = {}
    for option in options:  # compile, vllm, rollout-bfloat16, or the training dtype
        if option == "compile":
            extra["compile"] = "on"
        elif option == "vllm":  # --engine vllm, its Python from BEBOP_VLLM_PYTHON (or this one)
            extra["engine"] = "vllm"
        elif option in ("suffix", "both"):  # --drafter
            extra["drafter"] = option
        elif option.startswith("k") and option[1:].isdigit():  # this run's --k
            extra["k"] = int(option[1:])
        elif option.startswith("rollout-"):
            extra["rollout_dtype"] = option.removeprefix("rollout-")
        else:
            extra["dtype"] = option
    return {"name": text, "mode": mode, "spec": spec, "rollout_threads": rollout, "train_threads": train,
            "extra": extra}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--runs", default="sync:off,sync:rs,async:off@1/1,async:rs@1/1,async:rs@0/0")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--k", default="auto")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--batch-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=384)
    parser.add_argument("--task", default="math")
    parser.add_argument("--data", default="", help="prompts from this file instead of --task (every step an epoch when "
                        "it holds --batch-prompts rows), scored with --reward math")
    parser.add_argument("--difficulty", type=int, default=1,
                        help="task difficulty; 3 is the long-response configuration (math: longer worked answers, "
                             "where rollouts are most of the step)")
    parser.add_argument("--micro-batch-size", type=int, default=0, help="RLConfig.micro_batch_size (0: not passed)")
    args = parser.parse_args()
    base = None
    for run in map(parse_run, args.runs.split(",")):
        cfg = from_flat(RLConfig, dict(
            model=args.model, task=args.task, steps=args.steps,
            **({"data": args.data, "reward": "math"} if args.data else {}), mode=run["mode"], spec=run["spec"],
            **({"k": parse_k(args.k)} if run["spec"] != "off" else {}), group_size=args.group_size,
            batch_prompts=args.batch_prompts, difficulty=args.difficulty, max_new_tokens=args.max_new_tokens,
            save_every=args.steps, rollout_threads=run["rollout_threads"], train_threads=run["train_threads"],
            **({"micro_batch_size": args.micro_batch_size} if args.micro_batch_size else {})) | run["extra"])
        with tempfile.TemporaryDirectory() as tmp:
            train_rl(Path(tmp) / "run", cfg, progress=False)
            rows = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
        later = rows[1:] or rows
        med = {key: statistics.median(r[key] for r in later) for key in ("step_s", "rollout_s", "train_s", "wait_s")}
        base = base or med["step_s"]
        print(json.dumps({"run": run["name"], **{k: round(v, 3) for k, v in med.items()},
                          "speedup": round(base / med["step_s"], 3),
                          "reward": round(statistics.mean(r["reward"] for r in rows), 3),
                          "accept_len": round(statistics.mean(r["mean_acceptance_length"] for r in rows), 3),
                          "response_len_p50": statistics.median(r["response_len_p50"] for r in rows),
                          "response_len_max": max(r["response_len_max"] for r in rows),
                          "rollout_share": round(med["rollout_s"] / med["step_s"], 3)}), flush=True)
    print(json.dumps({"machine": machine()}))


if __name__ == "__main__":
    main()
