"""The suffix index's cost per row and decode step: inserting the tokens a step emits and proposing a draft.

    python benchmarks/suffix_lookup.py [--rows 64] [--steps 150] [--tokens 3] [--vocab 150] [--runs 5]

Random prompts of 60 tokens (one group per row) and random emitted tokens, generated before timing; prints the
median over runs of microseconds per row and step for `extend` and `propose`.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from bebop.engine.suffix_index import SuffixIndex

from common import machine, median


def one_run(args, seed: int) -> tuple[float, float]:
    rng = random.Random(seed)
    index = SuffixIndex()
    docs = [index.open([rng.randrange(args.vocab) for _ in range(60)]) for _ in range(args.rows)]
    emitted = [[[rng.randrange(args.vocab) for _ in range(args.tokens)] for _ in docs] for _ in range(args.steps)]
    extend_s = propose_s = 0.0
    for step in range(args.steps):
        t0 = time.perf_counter()
        for doc, tokens in zip(docs, emitted[step]):
            index.extend(doc, tokens)
        t1 = time.perf_counter()
        for doc in docs:
            index.propose(doc, 4)
        extend_s, propose_s = extend_s + t1 - t0, propose_s + time.perf_counter() - t1
    scale = 1e6 / (args.steps * args.rows)
    return extend_s * scale, propose_s * scale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--tokens", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=150)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    runs = [one_run(args, seed) for seed in range(args.runs)]
    print(json.dumps({"rows": args.rows, "tokens_per_step": args.tokens,
                      "extend_us_per_row_step": round(median([e for e, _ in runs]), 2),
                      "propose_us_per_row_step": round(median([p for _, p in runs]), 2), "machine": machine()}))


if __name__ == "__main__":
    main()
