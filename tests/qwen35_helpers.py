"""Tiny random Qwen3.5 hybrids saved by transformers (the reference the hybrid is checked against)."""

from __future__ import annotations

import torch

from conftest import CHAR_CODEC

LAYER_TYPES = ["linear_attention", "full_attention", "linear_attention", "linear_attention"]


def hf_qwen35_config(**overrides):
    from transformers import Qwen3_5TextConfig

    fields = dict(vocab_size=CHAR_CODEC.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                  linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
                  linear_conv_kernel_dim=4, layer_types=LAYER_TYPES, eos_token_id=CHAR_CODEC.eos_id,
                  pad_token_id=CHAR_CODEC.pad_id,
                  rope_parameters={"rope_type": "default", "rope_theta": 5000.0, "partial_rotary_factor": 0.5,
                                   "mrope_section": [2, 1, 1], "mrope_interleaved": True})
    fields.update(overrides)
    return Qwen3_5TextConfig(**fields)


def make_hf_qwen35(seed: int = 0, std: float = 0.3, **overrides):
    """A transformers Qwen3_5ForCausalLM with random weights: (1 + w) norms off zero, gated norms off one."""
    from transformers import Qwen3_5ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(hf_qwen35_config(**overrides)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                p.uniform_(0.5, 1.5)  # weight w
            elif "norm" in name:
                p.uniform_(-0.5, 0.5)  # (1 + w)
            elif name.endswith(("A_log", "dt_bias")):
                p.uniform_(-1.0, 1.0)
            else:
                p.normal_(0.0, std)
    return model
