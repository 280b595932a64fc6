"""bebop: lossless speculative rollouts with MTP draft heads for RL post-training."""

__version__ = "0.2.0"
