"""How a draft head differs from its target, per depth (the paper's Fig. 11 diagnostics):

    rows = draft_diagnostics(policy, sequences, depths=3, temperature=1.0)
    # [{"depth": 1, "kl": KL(p || q), "entropy_gap": H(q) - H(p), "alpha": sum_v min(p, q),
    #   "alpha_p_gt_q": sum_{v: p_v > q_v} q_v, "alpha_q_gt_p": sum_{v: q_v >= p_v} p_v, "chains": N}, ...]

p is the trunk's distribution at a chain position, q the head's (teacher-forced chains over the given
sequences, exactly the function drafting runs: bebop.mtp.chain), both at `temperature`. alpha is
the RS acceptance probability 1 - TV(p, q); it splits into the mass of the tokens the head
under-proposes (p > q: accepted with q's mass) and of those it over-proposes (q >= p: accepted
with p's mass). A ce / kl head spreads q (entropy gap > 0, mass lost where q > p); a tv head
matches the mass where it counts. Means over the kept chains; no gradient.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from bebop.errors import BebopError
from bebop.mtp.data import Sequence
from bebop.mtp.draft_stats import FIELDS, row_diagnostics
from bebop.mtp.train_step import chain_distributions, make_batch
from bebop.policy import Policy


@torch.no_grad()
def draft_diagnostics(policy: Policy, sequences: Seq[Sequence], *, depths: int, temperature: float,
                      batch_size: int = 16) -> list[dict]:
    if not sequences:
        raise BebopError("draft diagnostics need at least one sequence")
    sums = torch.zeros(depths, len(FIELDS), dtype=torch.float64)
    chains = 0
    for start in range(0, len(sequences), batch_size):
        batch = make_batch(list(sequences[start:start + batch_size]), depths, policy.pad_id)
        inputs = chain_distributions(policy, batch, depths, temperature)
        keep = inputs.mask if inputs.mask is not None else torch.ones(len(inputs.draft_logits), dtype=torch.bool)
        diag = row_diagnostics(inputs.draft_logits[keep], inputs.target_probs[keep])  # (n, D, 5)
        sums += diag.double().sum(0)
        chains += int(keep.sum())
    if chains == 0:
        raise BebopError(f"no chain of {depths} policy tokens in these sequences (too short?)")
    means = (sums / chains).tolist()
    return [{"depth": d + 1, **dict(zip(FIELDS, means[d])), "chains": chains} for d in range(depths)]
