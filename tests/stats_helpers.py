"""Chi-square goodness of fit for the lossless tests (no scipy: the survival function via gammaincc).

    grouped_chi2_pvalue([(counts, probs), ...])   # one test over several multinomials
    assert_follows(samples, probs)               # samples (N,) drawn from probs (V,)
"""

import torch

ALPHA = 1e-6  # a correct sampler fails a test about once in a million runs


def chi2_sf(stat: float, dof: int) -> float:
    half = torch.tensor(dof / 2.0, dtype=torch.float64)
    return float(torch.special.gammaincc(half, torch.tensor(stat / 2.0, dtype=torch.float64)))


def grouped_chi2_pvalue(groups) -> float:
    """groups: [(counts (V,) int64, probs (V,))]. H0: in every group, counts ~ Multinomial(n, probs).

    One test over all groups (statistics and degrees of freedom add). Bins with expected count < 5
    are pooled. A token with probability exactly 0 that was emitted fails outright.
    """
    stat, dof = 0.0, 0
    for counts, probs in groups:
        probs = probs.double()
        counts = counts.double()
        assert counts[probs == 0].sum() == 0, f"emitted a token with target probability 0: {counts} vs {probs}"
        support = probs > 0
        obs = counts[support]
        exp = counts.sum() * probs[support] / probs[support].sum()
        small = exp < 5
        if small.any():
            obs = torch.cat([obs[~small], obs[small].sum().reshape(1)])
            exp = torch.cat([exp[~small], exp[small].sum().reshape(1)])
            if exp[-1] < 5 and len(exp) > 1:  # pooled bin still too small: merge into the smallest bin
                j = int(exp[:-1].argmin())
                obs[j] += obs[-1]
                exp[j] += exp[-1]
                obs, exp = obs[:-1], exp[:-1]
        if len(exp) > 1:
            stat += float(((obs - exp) ** 2 / exp).sum())
            dof += len(exp) - 1
    return chi2_sf(stat, dof) if dof else 1.0


def assert_follows(samples: torch.Tensor, probs: torch.Tensor, alpha: float = ALPHA) -> None:
    """samples (N,) int64 drawn i.i.d. from probs (V,): nothing outside the support, chi-square p > alpha."""
    p_value = grouped_chi2_pvalue([(torch.bincount(samples, minlength=probs.numel()), probs)])
    assert p_value > alpha, p_value
