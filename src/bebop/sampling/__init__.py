"""Sampling: warping logits into the distribution sampled from, and lossless draft acceptance."""

from bebop.sampling.acceptance import rejection_sample, target_only_sample
from bebop.sampling.params import SamplingParams
from bebop.sampling.warp import entropy, sample, to_host, token_logprob, warp_logits, warp_probs

__all__ = ["SamplingParams", "entropy", "rejection_sample", "sample", "target_only_sample", "to_host", "token_logprob",
           "warp_logits", "warp_probs"]
