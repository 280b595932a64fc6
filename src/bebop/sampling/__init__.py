"""Sampling: warping logits into the distribution sampled from, and lossless draft acceptance."""

from bebop.sampling.params import SamplingParams
from bebop.sampling.warp import check_finite, entropy, sample, to_host, token_logprob, warp_logits, warp_probs

__all__ = ["SamplingParams", "check_finite", "entropy", "sample", "to_host", "token_logprob", "warp_probs"]
from bebop.sampling.acceptance import rejection_sample, target_only_sample

__all__ += ["rejection_sample", "target_only_sample"]
