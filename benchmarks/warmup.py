"""Warm-up of a new `--compile on` process, caches warm: the seconds before it decodes at speed.

    python benchmarks/warmup.py --model DIR [--before REV] [--cases plain:1,rs:3:1,rs:auto:64] [--runs 3]

Each case is ARM:BATCH (ARM `plain` or MODE:K): `bebop generate --compile on` over BATCH task prompts, 48 new
tokens each (`--ignore-eos`), in a fresh process. A first run per (case, tree) fills the caches (inductor's, and
the compiled-step store where the tree has one); then `--runs` runs alternate between the trees. Per case it
prints one JSON line: median `compile_warmup_s` (what the process reports), median wall seconds of the whole
process, and the tokens/s of its decoding apart from the warm-up, for this tree and, with --before, REV's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from spec_vs_plain import SRC, worktree, write_prompts

from common import machine, median


def run(src: Path, model: str, prompts: Path, case: str, out: Path) -> dict:
    *arm, batch = case.split(":")
    cmd = [sys.executable, "-m", "bebop", "generate", "--model", model, "--prompts", str(prompts),
           "--max-new-tokens", "48", "--ignore-eos", "--batch-size", batch, "--compile", "on", "--no-progress",
           "--out", str(out / "out.jsonl"), "--metrics-out", str(out / "metrics.json")]
    if arm != ["plain"]:
        cmd += ["--spec", arm[0], "--k", arm[1]]
    env = {**os.environ, "PYTHONPATH": str(src)}
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    metrics = json.loads((out / "metrics.json").read_text())
    return {"warmup_s": metrics["compile_warmup_s"], "wall_s": wall, "decode_tps": metrics["decode_tokens_per_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--before", help="a git revision whose engine runs beside this one")
    ap.add_argument("--cases", default="plain:1,rs:3:1,rs:auto:64")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    trees = {"after": SRC, **({"before": worktree(args.before)} if args.before else {})}
    print(json.dumps({"machine": machine(), "before": args.before}))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for case in args.cases.split(","):
            batch = int(case.split(":")[-1])
            prompts = write_prompts(args.model, "math", batch, out / "prompts.json")
            jsonl = out / "prompts.jsonl"
            jsonl.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in json.loads(prompts.read_text())))
            for src in trees.values():  # fills the caches
                run(src, args.model, jsonl, case, out)
            res: dict[str, list[dict]] = {name: [] for name in trees}
            for i in range(args.runs):
                for name in (list(trees) if i % 2 == 0 else list(trees)[::-1]):
                    res[name].append(run(trees[name], args.model, jsonl, case, out))
            print(json.dumps({"case": case, **{name: {key: round(median([r[key] for r in rs]), 3) for key in rs[0]}
                                               for name, rs in res.items()}}))


if __name__ == "__main__":
    main()
