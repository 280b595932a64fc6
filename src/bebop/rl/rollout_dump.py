"""Rollout records: RUN_DIR/rollouts/step-N.jsonl, one line per response of the step's batch, as
verl's rollout dumps (`bebop rl --dump-rollouts off` turns them off).

    {"step": 3, "index": 5, "group": 1, "prompt": "...", "completion": "...", "reward": 1.0,
     "policy_version": 2, "policy_tokens": 57, "acceptance_length": 2.85, "truncated": false,
     "drafts_by_source": {"mtp": {"drafts": 18, "accepted": 31}}, "prompt_ids": [...], "response_ids": [...]}

prompt: the prompt as the model read it (a chat rendered with its template); completion: every
token after it, environment observations included (prompt_ids and response_ids: the same as token ids, verl's
names, what `bebop mtp diagnose` reads); acceptance_length: the response's policy tokens
per target forward (1.0 without speculation); drafts_by_source: the response's verified drafts and accepted
draft tokens per drafter (the head, "mtp", or the rollouts' text, "suffix"; {} without drafting). Each file is
written atomically; a resumed run rewrites the files of the steps it redoes.
"""

from __future__ import annotations

from pathlib import Path

from bebop.jsonl import write_jsonl
from bebop.rl.records import RolloutBatch
from bebop.tokenizer import TextCodec

ROLLOUTS_DIR = "rollouts"


def rollout_path(run_dir: Path, step: int) -> Path:
    return run_dir / ROLLOUTS_DIR / f"step-{step:06d}.jsonl"


def dump_rollouts(run_dir: Path, step: int, batch: RolloutBatch, codec: TextCodec) -> Path:
    rows = [{"step": step, "index": i, "group": i // batch.group_size, "prompt": codec.decode(r.prompt_ids),
             "completion": codec.decode(r.token_ids), "reward": r.reward, "policy_version": r.policy_version,
             "policy_tokens": r.num_policy_tokens,
             "acceptance_length": None if r.acceptance_length is None else round(r.acceptance_length, 4),
             "truncated": r.truncated,
             "drafts_by_source": {s: {"drafts": n, "accepted": a} for s, (n, a) in sorted(r.drafts_by_source.items())},
             "prompt_ids": list(r.prompt_ids), "response_ids": list(r.token_ids)}
            for i, r in enumerate(batch.rollouts)]
    path = rollout_path(run_dir, step)
    write_jsonl(path, rows)  # atomic; makes the rollouts directory
    return path
