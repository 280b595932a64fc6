"""vLLM's speculative decoding against the acceptance the head allows, with and without bebop's vLLM-CPU fixes.

    python benchmarks/vllm_spec_bound.py --vllm-python /tmp/vllm-venv/bin/python [--prompts 64] [--new-tokens 24]
        [--out FILE.jsonl]

Builds a tiny random Qwen3.5 (transformers' layout, the sizes vLLM-CPU's kernels take) with a random MTP head,
then for each of (bebop's fixes on, off) x (--spec rs, to): vLLM samples `--prompts` rows at T=1 with K=2 MTP
drafts, and `bebop mtp diagnose` computes the head's lossless expectation on vLLM's own outputs, beside vLLM's
counters (`--engine-metrics`). Also counted: the sampler log-probs vLLM returned that are not finite or exactly 0
(impossible at T=1 for this model), and the share of token id 0 (1/V under plain decoding). docs/vllm.md has
the results and the cause.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

import torch

from bebop.cli import main as bebop
from bebop.model import load_model
from bebop.model.checkpoint import save_model
from bebop.sampling import SamplingParams
from bebop.tokenizer import build_char_tokenizer, codec_from_tokenizer, save_tokenizer

from common import machine


def build_hybrid(path: Path) -> None:
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    codec = codec_from_tokenizer(build_char_tokenizer())
    torch.manual_seed(0)
    cfg = Qwen3_5TextConfig(vocab_size=codec.vocab_size, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=256,
                            linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=64,
                            linear_value_head_dim=64, linear_conv_kernel_dim=4,
                            layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
                            eos_token_id=codec.eos_id, pad_token_id=codec.pad_id,
                            rope_parameters={"rope_type": "default", "rope_theta": 5000.0, "partial_rotary_factor": 0.5})
    model = Qwen3_5ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                p.uniform_(0.5, 1.5)
            elif "norm" in name:
                p.uniform_(-0.5, 0.5)
            elif name.endswith(("A_log", "dt_bias")):
                p.uniform_(-1.0, 1.0)
            else:
                p.normal_(0.0, 0.1)
    model.save_pretrained(path)
    save_tokenizer(build_char_tokenizer(), path)
    ours = load_model(path)
    ours.attach_mtp(1, torch.Generator().manual_seed(0))
    save_model(ours, path)


def measure(model_dir: Path, work: Path, spec: str, fixes: bool, args) -> dict:
    from bebop.vllm.serve import VllmServer

    codec = codec_from_tokenizer(build_char_tokenizer())
    model = load_model(model_dir, dtype=torch.bfloat16)
    prompts = [codec.encode(f"{i}+{i % 7}=") for i in range(args.prompts)]
    os.environ.pop("BEBOP_VLLM_NO_FIXES", None)
    if not fixes:
        os.environ["BEBOP_VLLM_NO_FIXES"] = "1"
    server = VllmServer(model, model_dir, dtype="bfloat16", spec=spec, k=2, python=args.vllm_python, seed=1)
    try:
        before = server.worker.counters()
        gens = server.engine(model, prompts, max_new_tokens=args.new_tokens, sampling=SamplingParams(1.0),
                             generator=torch.Generator().manual_seed(0))
        counters = server.worker.counters_since(before)
        applied = server.worker.fixes
    finally:
        server.close()
        os.environ.pop("BEBOP_VLLM_NO_FIXES", None)
    tag = f"{spec}-{'fixed' if fixes else 'asis'}"
    dump, metrics, out = work / f"{tag}.jsonl", work / f"{tag}-counters.json", work / f"{tag}.diagnosis"
    dump.write_text("".join(json.dumps({"prompt_token_ids": g.prompt_ids, "outputs": [{"token_ids": g.token_ids}]})
                            + "\n" for g in gens))
    metrics.write_text(json.dumps(counters))
    assert bebop(["mtp", "diagnose", "--model", str(model_dir), "--rollouts", str(dump), "--k", "2", "--temperature",
                  "1.0", "--engine-metrics", str(metrics), "--out", str(out)]) == 0
    report = json.loads((out / "diagnosis.json").read_text())
    logprobs = [lp for g in gens for lp in g.logprobs]
    tokens = [t for g in gens for t in g.token_ids]
    return {"spec": spec, "fixes": applied, "tokens": len(tokens),
            "token_0_share": round(sum(t == 0 for t in tokens) / len(tokens), 4),
            "logprobs_nan": sum(math.isnan(x) for x in logprobs), "logprobs_zero": sum(x == 0.0 for x in logprobs),
            "engine": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}
                       for row in report["engine_metrics"]["per_depth"]],
            "flagged_below_bound": report["engine_metrics"]["flagged"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", required=True, help="a Python with vllm-cpu installed")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--out", help="append the result lines to this JSONL file")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        build_hybrid(work / "model")
        for fixes in (False, True):
            for spec in ("rs", "to"):
                rows.append(measure(work / "model", work, spec, fixes, args))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    rows.append({"machine": machine(), "model": "random Qwen3.5 hidden 128, 4 layers, V 103, random 1-layer MTP head, "
                                                "K=2, T=1, vllm-cpu bfloat16"})
    for row in rows:
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "a") as fh:
            fh.writelines(json.dumps(row) + "\n" for row in rows)


if __name__ == "__main__":
    main()
