"""The expected acceptance of a head on given sequences, exact (docs/method.md section 8): the loss study's
measure and the patience rule's (`bebop mtp train --held-out N --eval-every S --patience P`).

    m = expected_acceptance(policy, sequences, k=3, temperature=1.0, seed=0)
    m["rs"]["rate"], m["rs"]["low"], m["rs"]["high"]   # accepted / drafted tokens at K (vLLM's definition)
    m["to"]["mean_acceptance_length"]                   # 1 + accepted / steps

The head's draft chains along the held-out sequences' own tokens at every drafting start (bebop.mtp.exact;
the sequences are the policy's samples at the measured temperature), the starts weighted by where a speculative
run's steps start given those tokens (the renewal of bebop.mtp.diagnose, docs/method.md section 8);
intervals are 95% normal intervals with the sequences as clusters. With a few thousand positions one
standard error is a few tenths of a point, against about 1 point for ~2,000 sampled drafts (the sampled
measure, bebop.mtp.evaluate).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from bebop.errors import BebopError
from bebop.mtp.data import Sequence
from bebop.mtp.diagnose import engine_view
from bebop.mtp.exact import expected_chains
from bebop.policy import Policy
from bebop.sampling import SamplingParams

MODES = ("rs", "to")


def first_turn(seq: Sequence) -> tuple[list[int], list[int]]:
    """(prompt ids, the completion up to its first environment token): the policy's own tokens of turn one."""
    cut = seq.env_mask.index(True) if True in seq.env_mask else len(seq.completion_ids)
    return seq.prompt_ids, seq.completion_ids[:cut]


def expected_acceptance(policy: Policy, sequences: Seq[Sequence], *, k: int, temperature: float, seed: int = 0,
                        batch_size: int = 64) -> dict:
    """{"positions": N, "rs": {...}, "to": {...}}: per rule the acceptance rate at K with its interval, the mean
    acceptance length and the conditional acceptance per depth."""
    pairs = [first_turn(s) for s in sequences]
    if sum(max(0, len(r) - 1) for _, r in pairs) == 0:
        raise BebopError("no drafting positions in the held-out sequences (every completion has < 2 tokens)")
    model = policy.model
    was_training = model.training
    model.eval()
    generator = torch.Generator(device=model.device).manual_seed(seed)
    try:
        chains = expected_chains(model, pairs, depth=k, sampling=SamplingParams(temperature), generator=generator,
                                 batch_size=batch_size, pad_id=policy.pad_id)
    finally:
        model.train(was_training)
    out: dict = {"positions": chains.starts}
    for mode in MODES:
        view = engine_view(getattr(chains, f"{mode}_reach"), k)
        length = view["mean_acceptance_length"]
        rate = {key: None if length[key] is None else (length[key] - 1) / k for key in ("value", "low", "high")}
        out[mode] = {"rate": rate["value"], "low": rate["low"], "high": rate["high"],
                     "mean_acceptance_length": length["value"], "per_depth": [d["value"] for d in view["per_depth"]]}
    return out
