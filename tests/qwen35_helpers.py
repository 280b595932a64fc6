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


MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)


def hf_qwen35_moe_config(**overrides):
    from transformers import Qwen3_5MoeTextConfig

    dense = hf_qwen35_config().to_dict()
    fields = {k: dense[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                    "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
                                    "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                    "linear_value_head_dim", "linear_conv_kernel_dim", "layer_types", "eos_token_id",
                                    "pad_token_id", "rope_parameters")}
    return Qwen3_5MoeTextConfig(**{**fields, **MOE, **overrides})


def make_hf_qwen35(seed: int = 0, std: float = 0.3, moe: bool = False, **overrides):
    """A transformers Qwen3_5ForCausalLM (Qwen3_5MoeForCausalLM with moe=True) with random weights:
    (1 + w) norms off zero, gated norms off one."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM

    torch.manual_seed(seed)
    if moe:
        model = Qwen3_5MoeForCausalLM(hf_qwen35_moe_config(**overrides)).eval()
    else:
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


KEPT_IN_FLOAT32 = ("linear_attn.A_log", "linear_attn.norm.weight")  # as published Qwen3.5 files store them


def save_hf_multimodal(path, seed: int = 0, max_shard_size: str = "60KB"):
    """A Qwen3_5ForConditionalGeneration laid out as published checkpoints are, saved by transformers:
    a tiny vision tower beside the text model (model.visual.*, model.language_model.*), bfloat16 with
    A_log and the gated norms' weights in float32, sharded, config `dtype` at the outer level only."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text = make_hf_qwen35(seed=seed)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4,
                  num_position_embeddings=16)
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=text.config.to_dict(), vision_config=vision))
    with torch.no_grad():
        model.model.language_model.load_state_dict(text.model.state_dict())
        model.lm_head.weight.copy_(text.lm_head.weight)
        for p in model.model.visual.parameters():
            p.normal_(0.0, 0.3)
    model = model.eval().to(torch.bfloat16)
    for name, p in model.named_parameters():
        if name.endswith(KEPT_IN_FLOAT32):
            p.data = p.data.float()
    model.save_pretrained(path, max_shard_size=max_shard_size)
    return model


def headed_hybrid(path):
    """A tiny hybrid saved by transformers into `path`, loaded by bebop with a fresh MTP head (seed 0)."""
    from bebop.model import load_model

    make_hf_qwen35(seed=3).save_pretrained(path)
    model = load_model(path)
    model.attach_mtp(1, torch.Generator().manual_seed(0))
    assert model.config.linear_layers and model.mtp is not None
    return model
