"""Rollout throughput: speculative decoding (MTP head; fixed K and --k auto) against plain decoding,
and the engine after a change against the engine before it, side by side in one run.

    python benchmarks/spec_vs_plain.py --model DIR [--before REV] [--cases 1:longtail,64:uniform,64:longtail]
                                       [--arms plain,rs:3,rs:auto] [--runs 3]

DIR is a policy with a trained MTP head. A case is BATCH:LENGTHS (decode_worker.py: `uniform` =
every row exactly --uniform-tokens with no stop, `longtail` = task prompts stopping at <eos>, up to
384 new tokens: the RL config's lengths). An arm is `plain` or MODE:K. With --before REV the arms
that REV's engine supports (`:auto` where it has engine/adaptive.py, `+compile` where it has compiled steps)
also run on a git worktree of REV. Every (case, arm,
engine) is a fresh process timed after a warm-up; the order rotates every run. An arm ending in
`+compile` runs compiled steps (its warm-up compiles: `warmup_s`; compared with the eager arm of the
same name as `vs_eager`). Per case it prints
one JSON line: median tokens/s per arm and the median over runs of each run's ratio to plain
decoding of the same engine (and, with --before, of each arm after / before).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common import machine, median

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"


def worktree(rev: str) -> Path:
    path = Path(f"/tmp/bebop-before-{rev}")
    if not path.exists():
        subprocess.run(["git", "-C", str(HERE.parent), "worktree", "add", "--detach", str(path), rev], check=True,
                       capture_output=True)
    return path / "src"


def write_prompts(model: str, task: str, batch: int, path: Path) -> Path:
    """The case's prompts, drawn once with this tree's tasks, so every engine decodes the same ones."""
    from bebop.tasks import get_task

    path.write_text(json.dumps([p.prompt for p in get_task(task).problems("test", batch, seed=batch)]))
    return path


def run_arm(src: Path, model: str, prompts: Path, lengths: str, arm: str, args) -> dict:
    cmd = [sys.executable, str(HERE / "decode_worker.py"), "--src", str(src), "--model", model,
           "--prompts", str(prompts), "--lengths", lengths, "--temperature", str(args.temperature),
           "--uniform-tokens", str(args.uniform_tokens), "--max-k", str(args.max_k), "--device", args.device]
    arm, compiled = arm.removesuffix("+compile"), arm.endswith("+compile")
    if arm != "plain":
        mode, k = arm.split(":")
        cmd += ["--spec", mode, "--k", k]
    if compiled:
        cmd += ["--compile", "on"]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--before", help="a git revision whose engine runs beside this one")
    parser.add_argument("--cases", default="1:longtail,64:uniform,64:longtail")
    parser.add_argument("--arms", default="plain,rs:3,rs:auto")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--task", default="math")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--uniform-tokens", type=int, default=48)
    parser.add_argument("--max-k", type=int, default=6)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (bfloat16 weights off the CPU)")
    args = parser.parse_args()
    engines = {"after": SRC}
    if args.before:
        engines["before"] = worktree(args.before)
    arms = args.arms.split(",")
    compiles = {eng: (src / "bebop" / "engine" / "compiled.py").exists() for eng, src in engines.items()}
    adapts = {eng: (src / "bebop" / "engine" / "adaptive.py").exists() for eng, src in engines.items()}
    jobs = [(eng, arm) for eng in engines for arm in arms
            if (adapts[eng] or ":auto" not in arm) and (compiles[eng] or not arm.endswith("+compile"))]
    for case in args.cases.split(","):
        batch, lengths = case.split(":")
        prompts = write_prompts(args.model, args.task, int(batch), Path(tempfile.mkdtemp()) / "prompts.json")
        results: dict = {job: [] for job in jobs}
        for r in range(args.runs):
            for job in jobs[r % len(jobs):] + jobs[: r % len(jobs)]:  # rotate the order every run
                results[job].append(run_arm(engines[job[0]], args.model, prompts, lengths, job[1], args))
        print(json.dumps(summarise(case, jobs, results, args.runs)), flush=True)
    print(json.dumps({"machine": machine()}))


def summarise(case: str, jobs, results, runs: int) -> dict:
    out = {"case": case, "runs": runs}
    for eng, arm in jobs:
        key = f"{eng}/{arm}"
        res = results[(eng, arm)]
        out[key] = {"tok_s": median([x["tok_s"] for x in res]), "accept_len": median([x["accept_len"] for x in res]),
                    "len_p50": res[0]["len_p50"], "len_max": res[0]["len_max"]}
        plain = "plain+compile" if arm.endswith("+compile") else "plain"  # plain decoding on the same path
        if (eng, plain) in results and arm != plain:
            ratios = [x["tok_s"] / p["tok_s"] for x, p in zip(res, results[(eng, plain)])]
            out[key].update(vs_plain=median(ratios), vs_plain_min=min(ratios), vs_plain_max=max(ratios))
        if eng == "after" and ("before", arm) in results:
            ratios = [a["tok_s"] / b["tok_s"] for a, b in zip(res, results[("before", arm)])]
            out[key]["vs_before"] = median(ratios)
        out[key]["warmup_s"] = median([x.get("warmup_s", 0.0) for x in res])
        eager = arm.removesuffix("+compile")
        if eager != arm and (eng, eager) in results:
            ratios = [x["tok_s"] / e["tok_s"] for x, e in zip(res, results[(eng, eager)])]
            out[key]["vs_eager"] = median(ratios)
        if "k_histogram" in res[-1]:
            out[key]["k_histogram"] = res[-1]["k_histogram"]
    return out


if __name__ == "__main__":
    main()
