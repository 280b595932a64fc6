"""One timed decoding run in a fresh process, against the bebop source tree given by --src.

    python benchmarks/decode_worker.py --src SRC --model DIR --prompts P.json --spec rs --k auto --lengths longtail

Used by spec_vs_plain.py so that the engine before a change (a git worktree of an older commit)
and after it run side by side in one benchmark. Loading and one warm-up run (which also profiles
the step costs for --k auto) are not timed; then --repeats timed runs with distinct seeds. Prints one
JSON line of medians (and the last run's k histogram), and the warm-up's seconds (with --compile on:
the compile time, less one run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", required=True, help="the src/ directory of the bebop to time")
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", required=True, help="JSON list of prompt texts (the same file for every engine)")
    parser.add_argument("--spec", default="off")
    parser.add_argument("--k", default="3")
    parser.add_argument("--max-k", type=int, default=6)
    parser.add_argument("--lengths", choices=("uniform", "longtail"), default="longtail",
                        help="uniform: every row generates exactly --uniform-tokens (no stop); "
                             "longtail: task prompts, stop at <eos>, up to --max-new-tokens")
    parser.add_argument("--uniform-tokens", type=int, default=48)
    parser.add_argument("--max-new-tokens", type=int, default=384)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (bfloat16 weights off the CPU)")
    parser.add_argument("--compile", default="off", help="on: compiled decoding steps (the warm-up compiles)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs (seeds seed..seed+repeats-1); medians")
    args = parser.parse_args()
    sys.path.insert(0, args.src)
    import torch

    from bebop.engine import generate
    from bebop.policy import load_policy
    from bebop.sampling import SamplingParams

    torch.set_num_threads(torch.get_num_threads())
    policy = load_policy(args.model, device=args.device, dtype="float32" if args.device == "cpu" else "bfloat16")
    if args.compile != "off":
        from bebop.engine.compiled import compile_steps

        compile_steps(policy.model, args.compile)
    prompts = [policy.codec.encode(text) for text in json.loads(open(args.prompts).read())]
    uniform = args.lengths == "uniform"
    common = dict(max_new_tokens=args.uniform_tokens if uniform else args.max_new_tokens,
                  sampling=SamplingParams(args.temperature), stop_ids=() if uniform else policy.stop_ids,
                  pad_id=policy.pad_id)

    def run(seed: int):
        generator = torch.Generator(args.device).manual_seed(seed)
        if args.spec == "off":
            return generate(policy.model, prompts, generator=generator, **common), None
        from bebop.engine.speculative import speculative_generate

        k = args.k if args.k == "auto" else int(args.k)
        extra = {"max_k": args.max_k} if k == "auto" else {}
        return speculative_generate(policy.model, prompts, k=k, mode=args.spec, generator=generator, **extra, **common)

    t0 = time.perf_counter()
    run(args.seed + 1000)  # warm-up (with --compile on: compiles)
    warmup_s = time.perf_counter() - t0
    timed = []
    for seed in range(args.seed, args.seed + args.repeats):
        t0 = time.perf_counter()
        gens, metrics = run(seed)
        seconds = time.perf_counter() - t0
        lengths = sorted(len(g.token_ids) for g in gens)
        timed.append({"seconds": seconds, "tokens": sum(lengths), "tok_s": sum(lengths) / seconds,
                      "len_p50": lengths[len(lengths) // 2], "len_max": lengths[-1],
                      "accept_len": metrics.mean_acceptance_length if metrics else 1.0,
                      "metrics": metrics})
    out = {key: statistics.median(t[key] for t in timed) for key in ("seconds", "tokens", "tok_s", "len_p50",
                                                                     "len_max", "accept_len")}
    out["warmup_s"] = warmup_s
    if metrics is not None and hasattr(metrics, "k_histogram"):
        out["k_histogram"] = metrics.to_dict()["k_histogram"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
