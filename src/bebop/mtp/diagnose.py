"""`bebop mtp diagnose`: what acceptance a head allows on rollouts someone else generated.

    report = diagnose(policy, pairs, k=3, sampling=SamplingParams(1.0), seed=0)
    write_diagnosis(report, out_dir)          # diagnosis.json, diagnosis.md

From the head's draft chains along the rollouts' own tokens at every drafting step start (bebop.mtp.exact), the
numbers the engine would measure on these sequences: a speculative run's steps do not start at every position
but after each step's accepted run, so each start is weighted by the probability, given the sequence, that a
step starts there (a renewal over the step's conditional law: a step at start j accepting a drafts starts the
next at j+a+1, with P(A = a | sequence) = R_a - R_{a+1}; docs/method.md section 8). Exact for rollouts sampled
from this policy at these settings.
Per depth d <= K: acceptance = sum_j w_j P(accepted through d) / sum_j w_j P(accepted through d-1), under RS
and TO (conditional on reaching d; `*_acceptance_rate_per_position` is vLLM's unconditional accepted at d /
drafts); the mean acceptance length at K = 1 + sum_j w_j sum_{d<=K} P(through d) / sum_j w_j (vLLM's
1 + accepted / drafts). Intervals are 95% normal intervals of these ratios over sequences as clusters (the
starts of one sequence are not independent). Also: the per-position averages (every start weighted alike),
the share of positions where RS beats TO (TV(p, q) < 1 - p(argmax q), docs/method.md section 5), the
depth-1 acceptance against the target's entropy (quantile bins and the fitted slope, bebop.stats.entropy_bins)
and the draft diagnostics per depth along the RS chains (KL, H(q) - H(p), the alpha split).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from bebop.errors import BebopError
from bebop.mtp.draft_stats import FIELDS
from bebop.mtp.exact import Chains, drafting_starts, expected_chains
from bebop.mtp.rollout_files import RolloutIds
from bebop.policy import Policy
from bebop.progress import bar as progress_bar
from bebop.sampling import SamplingParams
from bebop.stats.entropy_bins import acceptance_slope, per_token_law
from bebop.stats.intervals import Z95, cluster_ratio_se

MAX_REPORTED_K = 8


def renewal_weights(reach: np.ndarray, k: int) -> np.ndarray:
    """reach (N, D >= k): P(drafts 1..d accepted | the sequence) at each start of one sequence -> (N,) the
    probability, given the sequence, that a speculative run at K = k starts a step there (the first start is
    certain; a step accepting a drafts has probability reach_a - reach_{a+1}, or reach_k for a = k)."""
    n = len(reach)
    weights = np.zeros(n)
    if not n:
        return weights
    weights[0] = 1.0
    through = np.concatenate([np.ones((n, 1)), reach[:, :k]], axis=1)  # (N, k+1): P(A >= a), a = 0..k
    pmf = np.concatenate([through[:, :-1] - through[:, 1:], through[:, k:]], axis=1)  # (N, k+1): P(A = a)
    for j in range(n):
        end = min(n, j + k + 2)
        weights[j + 1: end] += weights[j] * pmf[j, : end - j - 1]
    return weights


def ratio_interval(num: np.ndarray, den: np.ndarray) -> dict:
    """sum(num) / sum(den) over clusters (n,) with its 95% normal interval (delta method)."""
    total = float(den.sum())
    if total <= 0:
        return {"value": None, "low": None, "high": None}
    value = float(num.sum()) / total
    se = cluster_ratio_se(num, den)
    if se is None:
        return {"value": value, "low": None, "high": None}
    return {"value": value, "low": value - Z95 * se, "high": value + Z95 * se}


def engine_view(reach: Sequence[torch.Tensor], k: int) -> dict:
    """What a run at K = k measures: per-depth acceptance and the mean acceptance length, with intervals."""
    num = np.zeros((len(reach), k))  # per sequence: sum_j w_j P(through d)
    den = np.zeros((len(reach), k))  # sum_j w_j P(through d-1)
    steps = np.zeros(len(reach))
    for i, seq in enumerate(reach):
        r = seq.numpy()  # (N, D)
        w = renewal_weights(r, k)
        through = np.concatenate([np.ones((len(r), 1)), r[:, :k]], axis=1)  # (N, k+1)
        num[i] = w @ through[:, 1:]
        den[i] = w @ through[:, :-1]
        steps[i] = w.sum()
    per_depth = [ratio_interval(num[:, d], den[:, d]) for d in range(k)]
    rate = [ratio_interval(num[:, d], steps)["value"] for d in range(k)]  # vLLM's: accepted at d / drafts
    length = ratio_interval(steps + num.sum(1), steps)
    return {"per_depth": per_depth, "rate_per_position": rate, "mean_acceptance_length": length}


def per_position(reach: Sequence[torch.Tensor], k: int) -> list[float | None]:
    """Per-depth acceptance with every start weighted alike."""
    r = torch.cat(list(reach)).numpy()[:, :k]  # (N, k)
    through = np.concatenate([np.ones((len(r), 1)), r], axis=1)
    den = through[:, :-1].sum(0)
    return [float(a / b) if b > 0 else None for a, b in zip(through[:, 1:].sum(0), den)]


def check_k(k: int) -> None:
    if not 1 <= k <= MAX_REPORTED_K:
        raise BebopError(f"--k must be in [1, {MAX_REPORTED_K}], got {k}")


def measure(policy: Policy, pairs: Sequence[RolloutIds], *, sampling: SamplingParams, seed: int = 0,
            batch_size: int = 64, progress: bool = True, what: str = "diagnose") -> Chains:
    """The head's chains (to depth MAX_REPORTED_K) at every drafting position of `pairs`."""
    sequences = [(p.prompt_ids, p.response_ids) for p in pairs]
    total = len(drafting_starts(sequences))
    if total == 0:
        raise BebopError(f"{what}: no drafting positions (every response has fewer than 2 tokens)")
    generator = torch.Generator(device=policy.model.device).manual_seed(seed)
    with progress_bar(total=total, desc=what, unit="pos", enabled=progress) as bar:
        return expected_chains(policy.model, sequences, depth=MAX_REPORTED_K, sampling=sampling, generator=generator,
                               batch_size=batch_size, pad_id=policy.pad_id, progress=bar.update)


def diagnose(policy: Policy, pairs: Sequence[RolloutIds], *, k: int, sampling: SamplingParams, seed: int = 0,
             entropy_bins: int = 10, batch_size: int = 64, progress: bool = True,
             baseline: Sequence[RolloutIds] | None = None) -> dict:
    """The report of `pairs`; with `baseline` (for example RL step 0's rollouts, `pairs` step N's) also the change
    in depth-1 acceptance split into what the entropy change explains and the mismatch remainder."""
    check_k(k)
    chains = measure(policy, pairs, sampling=sampling, seed=seed, batch_size=batch_size, progress=progress)
    report = summarise(chains, k, sampling, entropy_bins) | {"rollouts": len(pairs)}
    if baseline is not None:
        base = measure(policy, baseline, sampling=sampling, seed=seed, batch_size=batch_size, progress=progress,
                       what="baseline")
        report["change_from_baseline"] = change_split(base, chains)
    return report


def change_split(base: Chains, new: Chains) -> dict:
    """alpha_new - alpha_base at depth 1 (per position) = slope * (H_new - H_base) [entropy] + remainder
    [mismatch], the slope fitted on both files' positions together (docs/method.md section 5)."""
    h_base, h_new = torch.cat(base.entropy_1), torch.cat(new.entropy_1)
    out: dict = {"entropy_base": float(h_base.mean()), "entropy_new": float(h_new.mean())}
    for mode in ("rs", "to"):
        a_base, a_new = _depth_one(base, mode), _depth_one(new, mode)
        log = [(1, float(h), float(a), seq) for h, a, seq in zip(torch.cat([h_base, h_new]), torch.cat([a_base, a_new]),
                                                                  _sequence_ids(base) + _sequence_ids(new, len(base.entropy_1)))]
        fit = acceptance_slope(log, depth=1)
        change = float(a_new.mean() - a_base.mean())
        explained = fit["slope"] * (out["entropy_new"] - out["entropy_base"])
        out[mode] = {"acceptance_base": float(a_base.mean()), "acceptance_new": float(a_new.mean()),
                     "change": change, "entropy_part": explained, "mismatch_part": change - explained,
                     "slope": fit["slope"], "slope_interval": [fit["low"], fit["high"]]}
    return out


def _sequence_ids(chains: Chains, first: int = 0) -> list[int]:
    """Each start's sequence (from `first`): the clusters of the entropy law's intervals."""
    return [first + i for i, starts in enumerate(chains.entropy_1) for _ in range(len(starts))]


def _depth_one(chains: Chains, mode: str) -> torch.Tensor:
    return 1 - torch.cat(chains.tv_1) if mode == "rs" else torch.cat(chains.to_1)


def summarise(chains: Chains, k: int, sampling: SamplingParams, entropy_bins: int = 10) -> dict:
    views = {mode: {kk: engine_view(getattr(chains, f"{mode}_reach"), kk) for kk in range(1, MAX_REPORTED_K + 1)}
             for mode in ("rs", "to")}
    at_k = {mode: views[mode][k] for mode in views}
    tv, to1 = torch.cat(chains.tv_1), torch.cat(chains.to_1)
    ent = torch.cat(chains.entropy_1)
    report = {
        "k": k, "temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
        "positions": chains.starts,
        "rs_acceptance_per_depth": [x["value"] for x in at_k["rs"]["per_depth"]],
        "to_acceptance_per_depth": [x["value"] for x in at_k["to"]["per_depth"]],
        "rs_acceptance_rate_per_position": at_k["rs"]["rate_per_position"],  # vLLM's definition, unconditional
        "to_acceptance_rate_per_position": at_k["to"]["rate_per_position"],
        "rs_acceptance_intervals": [[x["low"], x["high"]] for x in at_k["rs"]["per_depth"]],
        "to_acceptance_intervals": [[x["low"], x["high"]] for x in at_k["to"]["per_depth"]],
        "mean_acceptance_length": {mode: {str(kk): v["mean_acceptance_length"]["value"] for kk, v in views[mode].items()}
                                   for mode in views},
        "mean_acceptance_length_intervals": {
            mode: {str(kk): [v["mean_acceptance_length"]["low"], v["mean_acceptance_length"]["high"]]
                   for kk, v in views[mode].items()} for mode in views},
        "per_position_acceptance": {mode: per_position(getattr(chains, f"{mode}_reach"), k) for mode in views},
        "rs_beats_to_share": float((tv < 1 - to1).double().mean()),
        "mean_target_entropy": float(ent.mean()),
        "draft_diagnostics": _diagnostics(chains, k),
    }
    for mode in ("rs", "to"):
        log = [(1, float(h), float(a), seq) for h, a, seq in zip(ent, _depth_one(chains, mode), _sequence_ids(chains))]
        report[f"{mode}_entropy_law"] = per_token_law(log, depths=1, bins=entropy_bins)
    return report


def _diagnostics(chains: Chains, k: int) -> list[dict]:
    assert chains.diag_sum is not None and chains.diag_weight is not None
    rows = []
    for d in range(k):
        weight = float(chains.diag_weight[d])
        values = (chains.diag_sum[d] / weight).tolist() if weight > 0 else [None] * len(FIELDS)
        rows.append({"depth": d + 1, **dict(zip(FIELDS, values)), "reach_weight": weight})
    return rows
