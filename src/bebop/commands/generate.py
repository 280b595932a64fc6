"""`bebop generate`: batched generation from a model directory, JSONL out."""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from bebop.chat import check_messages
from bebop.commands.flags import check_at_least_one, decode_spec
from bebop.decoding import Decoder, open_engine
from bebop.engine import FINISH_CONTEXT
from bebop.engine.compiled import compile_seconds
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


def generate_rows(policy: Policy, prompts: list[str], args: argparse.Namespace) -> tuple[list[dict], dict]:
    """Generate every prompt in batches; return the output rows and the metrics: throughput of the
    decoding alone (model loading and a vLLM worker's start excluded; the compiled steps' warm-up reported
    apart) and, with --spec, the acceptance metrics."""
    check_at_least_one(args, "max_new_tokens", "batch_size")
    spec = decode_spec(args)
    if spec.needs_head:
        policy.model.require_mtp()
    with open_engine(policy, spec, model_dir=args.model, rows=len(prompts), batch_size=args.batch_size,
                     max_new_tokens=args.max_new_tokens, sampling=sampling_from_args(args), dtype=args.dtype,
                     seed=args.seed) as decoder:
        before = compile_seconds(policy.model)
        rows, elapsed = _generate_batches(policy, prompts, args, decoder)
        compiling = compile_seconds(policy.model) - before  # graphs compiled inside the timed batches
    tokens = sum(len(row["token_ids"]) for row in rows)
    metrics = {"elapsed_s": elapsed, "generated_tokens": tokens, "tokens_per_s": tokens / elapsed if elapsed else 0.0,
               "compile_warmup_s": decoder.compile_warmup_s + compiling,
               "decode_tokens_per_s": tokens / (elapsed - compiling) if elapsed > compiling else 0.0}
    drafting = decoder.metrics  # merged over the batches
    return rows, {**metrics, **(drafting.to_dict() if drafting else {})}


def _generate_batches(policy: Policy, prompts: list[str], args: argparse.Namespace,
                      decoder: Decoder) -> tuple[list[dict], float]:
    """The output rows and the seconds spent decoding them."""
    sampling = sampling_from_args(args)
    generator = torch.Generator(device=policy.model.device).manual_seed(args.seed)
    rows, elapsed = [], 0.0
    batches = range(0, len(prompts), args.batch_size)
    for start in progress_bar(batches, desc="generate", unit="batch", enabled=len(batches) > 1 and not args.no_progress):
        texts = prompts[start:start + args.batch_size]
        ids = [policy.codec.encode(t) for t in texts]
        for i, toks in enumerate(ids):
            if not toks:
                raise BebopError(f"prompt {start + i} encodes to no tokens")
        t0 = time.perf_counter()
        gens = decoder(policy.model, ids, max_new_tokens=args.max_new_tokens, sampling=sampling,
                       stop_ids=() if args.ignore_eos else policy.stop_ids, generator=generator, pad_id=policy.pad_id)
        elapsed += time.perf_counter() - t0
        rows += [{"prompt": text, "completion": policy.codec.decode(gen.completion_ids), "token_ids": gen.token_ids,
                  "logprobs": gen.logprobs, "finish_reason": gen.finish_reason} for text, gen in zip(texts, gens)]
    return rows, elapsed


def _warn_context(rows: list[dict], context: int, max_new_tokens: int) -> None:
    """One line on stderr when prompts left less room than --max-new-tokens before the context's end."""
    cut = sum(row["finish_reason"] == FINISH_CONTEXT for row in rows)
    if cut:
        print(f"warning: {cut} of {len(rows)} rows reached the end of the model's {context}-token context before "
              f"--max-new-tokens {max_new_tokens} (finish_reason \"{FINISH_CONTEXT}\"): shorten their prompts for "
              "the full length", file=sys.stderr)


def run_generate(args: argparse.Namespace) -> None:
    given = collect_prompts(args)
    policy = load_policy(args.model, dtype=args.dtype, device=args.device, template_kwargs=args.chat_template_kwargs,
                         state_dtype=args.state_dtype)
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
