"""Weight sync to a vLLM worker after an RL update: the seconds `VllmServer.sync` takes per step, at model sizes.

    python benchmarks/vllm_sync.py --vllm-python PATH [--sizes default,1024x16] [--steps 5] [--arch qwen3|qwen35]
                                   [--spec off|rs] [--dtype float32|bfloat16]

A size is `default` (the embedded model: hidden 128, 12 layers) or HIDDENxLAYERS (the embedded model's config
with that hidden size and depth, intermediate 3 x hidden, head_dim 64; with --arch qwen35 decode_vs_vllm's random
Qwen3.5 hybrid with an MTP head, which --spec rs drafts with). Each step moves every trunk weight in place
(as an optimizer step does; with --spec rs the head's too) and times the sync that follows, from bebop's side
(everything until vLLM serves the new weights). To compare revisions, run alternately with PYTHONPATH=TREE/src:
the script uses only VllmServer's constructor, sync and close. Prints one JSON line per size: the median of the
steps after the first, the first, the weights' bytes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bebop.embedded import init_model_dir
from bebop.model import load_model
from bebop.vllm.serve import VllmServer
from decode_vs_vllm import build_model

from common import machine

VOCAB = 103  # the embedded tokenizer's


def write_model(out: Path, size: str, arch: str) -> None:
    """The embedded model at `size`; a Qwen3.5 hybrid with an MTP head (decode_vs_vllm's) for --arch qwen35."""
    hidden, layers = (128, 12) if size == "default" else (int(x) for x in size.split("x"))
    if arch == "qwen35":
        build_model(out, hidden, layers, VOCAB, arch="qwen35")
        return
    init_model_dir(out, seed=0, **({} if size == "default" else {
        "hidden_size": hidden, "intermediate_size": 3 * hidden, "num_hidden_layers": layers,
        "num_attention_heads": hidden // 64, "num_key_value_heads": max(1, hidden // 128), "head_dim": 64}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", required=True)
    parser.add_argument("--sizes", default="default,1024x16")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--arch", default="qwen3", choices=("qwen3", "qwen35"))
    parser.add_argument("--spec", default="off", choices=("off", "rs"))
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    for size in args.sizes.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            write_model(Path(tmp), size, args.arch)
            model = load_model(tmp)
            params = sum(p.numel() for p in model.parameters())
            server = VllmServer(model, tmp, dtype=args.dtype, spec=args.spec, k=2, python=args.vllm_python)
            times = []
            try:
                for _ in range(args.steps):
                    with torch.no_grad():
                        for p in model.parameters():
                            p.add_(1e-4)
                    t0 = time.perf_counter()
                    server.sync(model)
                    times.append(time.perf_counter() - t0)
            finally:
                server.close()
        print(json.dumps({"size": size, "arch": args.arch, "spec": args.spec, "dtype": args.dtype, "params": params,
                          "served_mb": round(params * torch.empty((), dtype=getattr(torch, args.dtype)).element_size()
                                             / 2**20, 1),
                          "sync_s": round(statistics.median(times[1:] or times), 4), "first_s": round(times[0], 4),
                          "machine": machine()}), flush=True)


if __name__ == "__main__":
    main()
