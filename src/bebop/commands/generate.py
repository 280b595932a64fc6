"""`bebop generate`: batched generation from a model directory, JSONL out."""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import nullcontext

import torch

from bebop.chat import check_messages
from bebop.commands.flags import check_at_least_one
from bebop.engine import FINISH_CONTEXT, generate
from bebop.engine.adaptive import AdaptiveK
from bebop.engine.compiled import compile_seconds, compile_steps, expected_decode_steps
from bebop.engine.metrics import SpecMetrics
from bebop.engine.speculative import AUTO, check_spec_flags, parse_k, speculative_generate
from bebop.engine.step_costs import step_costs
from bebop.errors import BebopError
from bebop.fileio import atomic_write_json
from bebop.jsonl import dumps_rows, read_numbered, write_jsonl
from bebop.policy import Policy, load_policy
from bebop.progress import bar as progress_bar
from bebop.sampling import SamplingParams


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)


def collect_prompts(args: argparse.Namespace) -> list[str | list[dict]]:
    """--prompt texts, then --prompts rows: `prompt` (text, or a list of chat messages) or `messages`."""
    prompts: list[str | list[dict]] = list(args.prompt)
    if args.prompts:
        rows = read_numbered(args.prompts)
        if not rows:
            raise BebopError(f"--prompts {args.prompts} has no rows")
        prompts += [_file_prompt(row, f"{args.prompts}: row {number}") for number, row in rows]
    if not prompts:
        raise BebopError("give at least one --prompt or a --prompts FILE.jsonl")
    for i, text in enumerate(prompts):
        if not text:
            raise BebopError(f"prompt {i} is empty")
    return prompts


def _file_prompt(row: dict, what: str) -> str | list[dict]:
    """A --prompts row's prompt: text, or a list of chat messages (under `prompt` or `messages`)."""
    key = "prompt" if "prompt" in row else "messages"
    if key not in row:
        raise BebopError(f"{what} has no 'prompt' (or 'messages') key")
    value = row[key]
    if isinstance(value, list):
        return check_messages(value, what)
    if not isinstance(value, str):
        raise BebopError(f"{what}: {key!r} must be text or a list of chat messages, got {type(value).__name__} "
                         f"{json.dumps(value)[:40]}")
    return value


def check_generate_args(policy: Policy, args: argparse.Namespace) -> None:
    """Every flag problem, before anything is generated or written."""
    check_at_least_one(args, "max_new_tokens", "batch_size")
    check_spec_flags(args.spec, args.k, args.max_k)
    if args.spec != "off":
        policy.model.require_mtp()
    if args.engine == "vllm" and args.k == AUTO:
        raise BebopError("--k auto needs bebop's engine: vLLM verifies a fixed number of drafts (give --k K)")


def start_vllm(policy: Policy, args: argparse.Namespace):
    """The vLLM worker serving --model (its MTP head drafting with --spec), or None on bebop's engine."""
    if args.engine != "vllm":
        return None
    from bebop.vllm.serve import VllmServer

    return VllmServer(policy.model, args.model, dtype=args.dtype, spec=getattr(args, "spec", "off"),
                      k=getattr(args, "k", 3), python=args.vllm_python or None, seed=args.seed)


def _decode_batch(policy: Policy, ids: list[list[int]], common: dict, args: argparse.Namespace, controller,
                  server) -> tuple[list, SpecMetrics | None]:
    """One batch through the chosen engine: its generations and, when it drafted, its acceptance metrics."""
    if server is not None:
        sink: list[SpecMetrics] = []
        with server.engine.counting(args.k, sink) if args.spec != "off" else nullcontext():
            gens = server.engine(policy.model, ids, **common)
        return gens, sink[0] if sink else None
    if args.spec == "off":
        return generate(policy.model, ids, **common), None
    return speculative_generate(policy.model, ids, k=args.k, mode=args.spec, max_k=args.max_k,
                                controller=controller, **common)


def generate_rows(policy: Policy, prompts: list[str], args: argparse.Namespace) -> tuple[list[dict], dict]:
    """Generate every prompt in batches; return the output rows and the metrics: throughput of the
    decoding alone (model loading excluded) and, with --spec, the acceptance metrics."""
    args.k = parse_k(args.k)
    check_generate_args(policy, args)
    controller = None
    if args.engine == "bebop":
        compile_steps(policy.model, args.compile, expected_decode_steps(len(prompts), args.batch_size,
                                                                        args.max_new_tokens))
    compiled_before = compile_seconds(policy.model)
    if args.k == AUTO:  # profiled through the compiled steps when compiled, whose graphs this compiles
        costs = step_costs(policy.model, max_rows=min(args.batch_size, len(prompts)), max_k=args.max_k,
                           mode=args.spec, sampling=sampling_from_args(args))
        controller = AdaptiveK(args.max_k, costs)  # one per command: acceptance carries across batches
    with start_vllm(policy, args) or nullcontext() as server:
        rows, spec, elapsed = _generate_batches(policy, prompts, args, controller, server)
    tokens = sum(len(row["token_ids"]) for row in rows)
    warmup = compile_seconds(policy.model) - compiled_before  # compiling the steps, inside elapsed
    metrics = {"elapsed_s": elapsed, "generated_tokens": tokens, "tokens_per_s": tokens / elapsed if elapsed else 0.0,
               "compile_warmup_s": warmup,
               "decode_tokens_per_s": tokens / (elapsed - warmup) if elapsed > warmup else 0.0}
    return rows, {**metrics, **(spec.to_dict() if spec else {})}


def _generate_batches(policy: Policy, prompts: list[str], args: argparse.Namespace, controller,
                      server) -> tuple[list[dict], SpecMetrics | None, float]:
    """The output rows, the merged acceptance metrics (with --spec) and the seconds spent decoding."""
    sampling = sampling_from_args(args)
    spec = SpecMetrics(args.max_k if args.k == AUTO else args.k) if args.spec != "off" else None
    generator = torch.Generator(device=policy.model.device).manual_seed(args.seed)
    rows, elapsed = [], 0.0
    batches = range(0, len(prompts), args.batch_size)
    for start in progress_bar(batches, desc="generate", unit="batch", enabled=len(batches) > 1 and not args.no_progress):
        texts = prompts[start:start + args.batch_size]
        ids = [policy.codec.encode(t) for t in texts]
        for i, toks in enumerate(ids):
            if not toks:
                raise BebopError(f"prompt {start + i} encodes to no tokens")
        common = dict(max_new_tokens=args.max_new_tokens, sampling=sampling,
                      stop_ids=() if args.ignore_eos else policy.stop_ids, generator=generator, pad_id=policy.pad_id)
        t0 = time.perf_counter()
        gens, batch_metrics = _decode_batch(policy, ids, common, args, controller, server)
        elapsed += time.perf_counter() - t0
        if spec is not None and batch_metrics is not None:
            spec = spec.merge(batch_metrics)
        rows += [{"prompt": text, "completion": policy.codec.decode(gen.completion_ids), "token_ids": gen.token_ids,
                  "logprobs": gen.logprobs, "finish_reason": gen.finish_reason} for text, gen in zip(texts, gens)]
    return rows, spec, elapsed


def _warn_context(rows: list[dict], context: int, max_new_tokens: int) -> None:
    """One line on stderr when prompts left less room than --max-new-tokens before the context's end."""
    cut = sum(row["finish_reason"] == FINISH_CONTEXT for row in rows)
    if cut:
        print(f"warning: {cut} of {len(rows)} rows reached the end of the model's {context}-token context before "
              f"--max-new-tokens {max_new_tokens} (finish_reason \"{FINISH_CONTEXT}\"): shorten their prompts for "
              "the full length", file=sys.stderr)


def run_generate(args: argparse.Namespace) -> None:
    given = collect_prompts(args)
    policy = load_policy(args.model, dtype=args.dtype, device=args.device, template_kwargs=args.chat_template_kwargs)
    prompts = [policy.prompt_text(p, f"prompt {i}") for i, p in enumerate(given)]  # chats rendered
    rows, metrics = generate_rows(policy, prompts, args)
    _warn_context(rows, policy.model.config.max_position_embeddings, args.max_new_tokens)
    if args.out:
        write_jsonl(args.out, rows)
    else:
        sys.stdout.write(dumps_rows(rows))
    if args.metrics_out:
        atomic_write_json(args.metrics_out, metrics)
    else:
        print(json.dumps(metrics), file=sys.stderr)
