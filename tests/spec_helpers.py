"""Shared pieces of the speculative-decoding tests: prompts, drafters that replace the MTP head
with a known proposal (an oracle that is right except at a random depth; a mixture that is close
to the target), so acceptance is ragged and the expected output is known, and the check that sampled
rows follow the target."""

import copy
import random

import torch

from bebop.engine.compiled import compile_steps
from bebop.sampling import warp_probs
from bebop.sampling.warp import inverse_cdf

from conftest import CHAR_CODEC
from stats_helpers import assert_follows

PROMPTS = ["Q: 12 + 7 = ?", "hello world", "a", "The price of 3 apples is", "xy", "0123456789"]
EOS = CHAR_CODEC.eos_id


def ids_of(prompts):
    return [CHAR_CODEC.encode(p) for p in prompts]


def on_path(model, path: str):
    """`model` on one of the paths the engine samples on: "float32" (itself), "bfloat16" (a bfloat16 copy) or
    "compiled" (a copy with compiled steps)."""
    if path == "float32":
        return model
    model = copy.deepcopy(model)
    if path == "bfloat16":
        return model.to(torch.bfloat16)
    assert path == "compiled" and compile_steps(model, "on")
    return model


def assert_positions_follow(model, prompt, gens, params, positions):
    """Rows sampled from one prompt: at each of `positions`, the tokens of the rows that share the most frequent
    prefix before it follow the warped target after that prefix (chi-square, stats_helpers.assert_follows)."""
    prefix, rows = [], list(gens)
    for pos in range(max(positions) + 1):
        tokens = torch.tensor([g.token_ids[pos] for g in rows])
        if pos in positions:
            with torch.no_grad():
                p = warp_probs(model.logits(model(torch.tensor([prompt + prefix])))[0, -1], params)  # (V,)
            assert_follows(tokens, p)
        top = int(torch.bincount(tokens).argmax())
        prefix, rows = prefix + [top], [g for g in rows if g.token_ids[pos] == top]



def assert_marginals_follow(model, prompt, gens, params, positions: int) -> None:
    """Rows sampled from one prompt: the tokens at each position < `positions` follow that position's exact marginal
    law under the warped target (every earlier token summed over: V ** pos sequences scored in one forward), so
    every row counts, not only those sharing a prefix (chi-square, stats_helpers.assert_follows)."""
    vocab = model.config.vocab_size
    law = torch.ones(1, dtype=torch.float64)  # (V ** pos,): the probability of each prefix of length pos
    prefixes = torch.tensor([prompt])  # (V ** pos, len(prompt) + pos)
    for pos in range(positions):
        with torch.no_grad():
            nxt = warp_probs(model.logits(model(prefixes))[:, -1], params).double()  # (V ** pos, V)
        joint = law[:, None] * nxt  # (V ** pos, V)
        tokens = torch.tensor([g.token_ids[pos] for g in gens])  # (N,)
        assert_follows(tokens, joint.sum(0) / joint.sum())
        law = joint.reshape(-1)  # (V ** (pos + 1),)
        prefixes = torch.cat([prefixes.repeat_interleave(vocab, 0), torch.arange(vocab).repeat(prefixes.shape[0])[:, None]],
                             dim=1)


def oracle_drafter(model, prompts, corrupt: float, seed: int):
    """A drafter that knows the greedy continuation: drafts are right except at a random depth
    (with probability `corrupt` per chain), so rows accept 0..K tokens raggedly. It rebuilds each
    row's sequence from what the engine hands the head: the prompt (refreshed at prefill), then every
    refresh chunk's next-tokens in order."""
    seqs = [list(p) for p in prompts]
    rng = random.Random(seed)

    def draft(steps, model_, mtp_cache, ref_hidden, ref_tokens, ref_count, k, mode, sampling, draws, rows):
        drafts = []
        for i, b in enumerate(rows):  # rows: the prompt index of each live row
            c = int(ref_count[i])
            seqs[b] += ref_tokens[i, :c].tolist()
            seq = list(seqs[b])
            row = []
            with torch.no_grad():
                for _ in range(k):
                    nxt = int(model.logits(model(torch.tensor([seq])))[0, -1].argmax())
                    row.append(nxt)
                    seq.append(nxt)
            if rng.random() < corrupt:
                d = rng.randrange(k)
                row[d] = (row[d] + 1) % model.config.vocab_size
            drafts.append(row)
        drafts = torch.tensor(drafts, dtype=torch.long).reshape(len(rows), k)  # (R, K)
        probs = torch.nn.functional.one_hot(drafts, model.config.vocab_size).float()  # (B, K, V)
        return drafts, probs

    return draft



def mixture_drafter(model, prompts, params):
    """A sampling drafter whose q_d = 0.7 p_d + 0.3 uniform-over-p_d's-support, where p_d is the
    exact target row (full forward), so RS accepts often (about 0.85) yet not always."""
    seqs = [list(p) for p in prompts]  # the prompt is refreshed at prefill; the log carries what follows

    def draft(steps, model_, mtp_cache, ref_hidden, ref_tokens, ref_count, k, mode, sampling, draws, live):
        for i, b in enumerate(live):  # live: the prompt index of each live row
            seqs[b] += ref_tokens[i, : int(ref_count[i])].tolist()
        drafts = torch.zeros(len(live), k, dtype=torch.long)  # (R, K)
        probs = torch.zeros(len(live), k, model.config.vocab_size)  # (R, K, V)
        for length in {len(seqs[b]) for b in live}:  # rows advance raggedly: one batched oracle per length
            rows = [i for i, b in enumerate(live) if len(seqs[b]) == length]
            seq = torch.tensor([seqs[live[i]] for i in rows])  # (R, T)
            with torch.no_grad():
                for d in range(k):
                    target = warp_probs(model.logits(model(seq))[:, -1], params)  # (R, V)
                    support = (target > 0).float()
                    q = 0.7 * target + 0.3 * support / support.sum(-1, keepdim=True)
                    y = inverse_cdf(q, draws[rows, d])[:, None]  # (R, 1): the engine's draw for depth d
                    drafts[rows, d] = y[:, 0]
                    probs[rows, d] = q
                    seq = torch.cat([seq, y], dim=1)
        return drafts, probs

    return draft


