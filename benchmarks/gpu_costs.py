"""What decode and verify cost at real model shapes, and the K the adaptive rule would pick there.

    python benchmarks/gpu_costs.py [--device cuda] [--shapes qwen3-1.7b,qwen3-8b] [--batches 1,4,16,32,64,128,256]
                                   [--max-k 7] [--context 512] [--acceptance 0.6,0.7,0.8,0.9] [--compile]
                                   [--out benchmarks/results/gpu_costs.jsonl]
    python benchmarks/gpu_costs.py --device cpu --tiny        # the same code path in seconds (in the test suite)

Random-weight models with the shapes of the named checkpoints (nothing is downloaded: timing does
not depend on the weights' values), bfloat16 on CUDA (float32 on the CPU), one MTP layer. For each
batch of live rows after --context cached positions it times, with the engine's own profiling
forwards (bebop.engine.step_costs: a cached trunk forward plus LM head, ending in a host sync):
decode(1), verify(K+1) for K = 1..max_k, and one MTP draft step. From those it predicts what
speculation would gain at a constant per-depth acceptance alpha, and which K the engine's adaptive
rule (AdaptiveK.best: the K of highest predicted tokens/s, or 0 unless it beats plain steps by
DRAFT_MARGIN) picks:

    speedup(K) = E(K) * decode(1) / (verify(K+1) + K * mtp),   E(K) = 1 + alpha + ... + alpha^K

Each timing is the median of --repeats calls after 2 warm-up calls. With --compile, decode(1) is
also timed through torch.compile(mode="reduce-overhead") (CUDA graphs on a GPU); a failure to
compile is recorded, not raised. One JSON line per (shape, batch) goes to stdout and --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bebop.engine.adaptive import AcceptanceEstimate, AdaptiveK
from bebop.engine.step_costs import StepCosts, mtp_step, trunk_forward
from bebop.fileio import atomic_write_text
from bebop.model.config import ModelConfig
from bebop.model.qwen3 import CausalLM

from common import machine

HYBRID = dict(model_type="qwen3_5_text", attn_output_gate=True, partial_rotary_factor=0.25)
# the published configs' shapes (config.json of each checkpoint); rope and context do not change the cost
SHAPES = {
    "qwen3-1.7b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "qwen3-8b": dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16),
    # the Qwen3.5 hybrid: 3 Gated DeltaNet layers to 1 gated full-attention layer; the shape of transformers'
    # default Qwen3_5TextConfig (its docs name Qwen/Qwen3.5-27B), and a tiny one for this CPU
    "qwen3.5-hybrid": dict(vocab_size=248320, hidden_size=4096, intermediate_size=12288, num_hidden_layers=32,
                           num_attention_heads=16, num_key_value_heads=4, head_dim=256, **HYBRID),
    "tiny-hybrid": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, **HYBRID,
                        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                        linear_value_head_dim=16),
}


def build(shape: str, device: torch.device, dtype: torch.dtype, context: int) -> CausalLM:
    """A random-weight model of `shape` with one MTP layer, made directly on `device` in `dtype`."""
    fields = dict(SHAPES[shape])
    if fields.get("model_type") == "qwen3_5_text":
        fields["layer_types"] = tuple("full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                                      for i in range(fields["num_hidden_layers"]))
    cfg = ModelConfig(**fields, max_position_embeddings=context + 64, rope_theta=1e6, mtp_num_hidden_layers=1)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = CausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    return model.eval()


def median_seconds(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    for _ in range(2):  # warm-up: allocations, kernel selection, compilation
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()  # ends in a host sync (.item())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def compiled_decode(model: CausalLM, rows: int, context: int, repeats: int, device: torch.device) -> float | str:
    """decode(1) through torch.compile(mode="reduce-overhead"): seconds, or why it failed."""
    try:
        forward = torch.compile(model.forward, mode="reduce-overhead", dynamic=False)
        cache = model.new_cache(rows, context + 1)
        ids = torch.zeros(rows, 1, dtype=torch.long, device=device)  # (R, 1)

        def step() -> None:
            cache.span = context
            cache.lengths.fill_(context)
            model.logits(forward(ids, cache)).sum().item()

        return median_seconds(step, repeats, device)
    except Exception as exc:  # noqa: BLE001 -- a measurement: the reason is the result
        return f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def measure(model: CausalLM, rows: int, max_k: int, context: int, repeats: int, device: torch.device) -> dict:
    """Seconds of decode(1), verify(K+1) for K = 1..max_k and one MTP step at `rows` live rows."""
    trunk_cache = model.new_cache(rows, context + max_k + 1)  # reused: allocation is not a step's cost
    mtp_cache = model.require_mtp().new_cache(rows, context + 1, dtype=model.dtype, device=device)
    with torch.inference_mode():
        decode = median_seconds(lambda: trunk_forward(model, rows, 1, context, trunk_cache), repeats, device)
        verify = [median_seconds(lambda k=k: trunk_forward(model, rows, k + 1, context, trunk_cache), repeats, device)
                  for k in range(1, max_k + 1)]
        mtp = median_seconds(lambda: mtp_step(model, rows, context, mtp_cache), repeats, device)
    return {"decode_s": decode, "verify_s": verify, "mtp_s": mtp}


def predictions(rows: int, timing: dict, max_k: int, alphas: list[float]) -> list[dict]:
    """Per alpha: the predicted speedup of every K and the K the adaptive rule picks."""
    trunk = {(rows, 1): timing["decode_s"]} | {(rows, k + 1): s for k, s in enumerate(timing["verify_s"], start=1)}
    costs = StepCosts(trunk, {rows: timing["mtp_s"]}, max_k)
    out = []
    for alpha in alphas:
        rule = AdaptiveK(max_k, costs)
        rule.acceptance = AcceptanceEstimate.constant([alpha] * max_k)
        plain = rule.throughput(rows, 0)
        speedups = [rule.throughput(rows, k) / plain for k in range(1, max_k + 1)]
        chosen = rule.best(rows)
        out.append({"alpha": alpha, "speedup_per_k": [round(x, 3) for x in speedups], "chosen_k": chosen,
                    "chosen_speedup": round(speedups[chosen - 1], 3) if chosen else 1.0})
    return out


def run(args: argparse.Namespace) -> list[dict]:
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shapes = ["tiny", "tiny-hybrid"] if args.tiny else args.shapes.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    alphas = [float(a) for a in args.acceptance.split(",")]
    where = machine() + (f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else "")
    lines = []
    for shape in shapes:
        if shape not in SHAPES:
            raise SystemExit(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
        model = build(shape, device, dtype, args.context)
        for rows in batches:
            timing = measure(model, rows, args.max_k, args.context, args.repeats, device)
            line = {"shape": shape, "batch": rows, "context": args.context, "dtype": str(dtype).removeprefix("torch."),
                    "device": str(device), **{k: v if isinstance(v, float) else [round(x, 6) for x in v]
                                              for k, v in timing.items()},
                    "verify_over_decode": [round(v / timing["decode_s"], 3) for v in timing["verify_s"]],
                    "mtp_over_decode": round(timing["mtp_s"] / timing["decode_s"], 3),
                    "rule": predictions(rows, timing, args.max_k, alphas), "machine": where}
            if args.compile:
                with torch.inference_mode():
                    line["decode_compiled_s"] = compiled_decode(model, rows, args.context, args.repeats, device)
            print(json.dumps(line), flush=True)
            lines.append(line)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="auto (cuda when present), cuda, cuda:N or cpu")
    parser.add_argument("--shapes", default="qwen3-1.7b,qwen3-8b,qwen3.5-hybrid",
                        help=f"comma-separated: {', '.join(SHAPES)}")
    parser.add_argument("--tiny", action="store_true", help="the tiny shape at small batches: the code path in seconds")
    parser.add_argument("--batches", default="1,4,16,32,64,128,256")
    parser.add_argument("--max-k", type=int, default=7)
    parser.add_argument("--context", type=int, default=512, help="cached positions before the timed step")
    parser.add_argument("--acceptance", default="0.6,0.7,0.8,0.9", help="per-depth acceptance rates to predict at")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--compile", action="store_true", help="also time decode(1) through torch.compile")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON lines here (atomically)")
    args = parser.parse_args(argv)
    if args.tiny and "--batches" not in (argv if argv is not None else sys.argv):
        args.batches, args.context, args.repeats = "1,4,16", 64, 5
    lines = run(args)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out, "".join(json.dumps(line) + "\n" for line in lines))


if __name__ == "__main__":
    main()
