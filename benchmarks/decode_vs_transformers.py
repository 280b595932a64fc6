"""Decode throughput: bebop's engine against transformers' generate(), same weights, side by side.

    python benchmarks/decode_vs_transformers.py [--runs 5] [--new-tokens 128] [--batch-sizes 1,32] [--compile on]

Builds the embedded default model (random weights, its real size), saves it, loads it into both
`bebop` and `transformers.Qwen3ForCausalLM`, and times greedy generation of exactly
`--new-tokens` tokens per row (no stop token) from a 16-token prompt. Runs alternate between the
two implementations; the reported ratio is the median over runs of the per-run ratio. With
`--compile on` bebop decodes with compiled steps (the warm-up run compiles them).
"""

from __future__ import annotations

import argparse
import json
import tempfile

import torch

from bebop.embedded import init_model_dir
from bebop.engine import generate
from bebop.engine.compiled import COMPILE_CHOICES, compile_steps
from bebop.model import load_model
from bebop.sampling import SamplingParams

from common import machine, median, timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batch-sizes", default="1,32")
    parser.add_argument("--compile", choices=COMPILE_CHOICES, default="off", help="bebop's --compile")
    args = parser.parse_args()
    from transformers import Qwen3ForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        init_model_dir(tmp, seed=0)
        ours = load_model(tmp)
        theirs = Qwen3ForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
    compile_steps(ours, args.compile)
    n = args.new_tokens
    results = []
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        prompts = torch.randint(10, 100, (batch, 16), generator=torch.Generator().manual_seed(batch))

        def run_ours():
            gens = generate(ours, prompts.tolist(), max_new_tokens=n, sampling=SamplingParams(0.0))
            assert all(len(g.token_ids) == n for g in gens)

        def run_theirs():
            with torch.no_grad():
                out = theirs.generate(prompts, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                      pad_token_id=0)
            assert out.shape[1] == 16 + n

        run_ours(), run_theirs()  # warm up
        ratios, t_ours, t_theirs = [], [], []
        for _ in range(args.runs):
            a, b = timed(run_ours), timed(run_theirs)
            t_ours.append(a)
            t_theirs.append(b)
            ratios.append(b / a)
        results.append({"batch": batch, "new_tokens": n, "runs": args.runs, "compile": args.compile,
                        "bebop_tok_s": batch * n / median(t_ours), "transformers_tok_s": batch * n / median(t_theirs),
                        "speedup_median": median(ratios), "speedup_min": min(ratios), "speedup_max": max(ratios)})
        print(json.dumps(results[-1]), flush=True)
    print(json.dumps({"machine": machine()}))


if __name__ == "__main__":
    main()
