"""The MTP head computes what vLLM and SGLang compute (docs/method.md section 2, issue 15).

The reference below is written from vLLM's `qwen3_next_mtp.py` forward, without caches: the head
reads the trunk's hidden state AFTER its final norm, and depth d+1 reads depth d's output after
`mtp.norm` (the tensor its logits came from). Drafting at depth 2 for chain t is one causal
decoder-layer pass over the refreshed inputs at positions 0..t followed by the depth-2 input at t+1.
"""

import torch

from bebop.model import load_model
from bebop.model.layers import attention_context
from bebop.mtp.chain import chain_forward, shifted


def _headed(path):
    """The tiny transformers-saved trunk with a fresh head whose norms are not all ones (a misplaced
    norm would cancel out against unit weights)."""
    model = load_model(path)
    model.attach_mtp(1, torch.Generator().manual_seed(0))
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for name, p in model.mtp.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
    return model


def _layer_last(model, x: torch.Tensor) -> torch.Tensor:
    """x (1, T, H) at positions 0..T-1 through the head's layer, plain causal attention -> (1, H) at T-1."""
    cfg = model.config
    positions = torch.arange(x.shape[1])[None]  # (1, T)
    ctx = attention_context(positions, None, cfg.head_dim, cfg.rope_theta, x.dtype)
    return model.mtp.layers[0](x, ctx)[:, -1]


def _reference_logits(model, ids: torch.Tensor, t: int, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Depth-1 and depth-2 draft logits (V,) of chain t, teacher-forced on `ids` (1, T)."""
    head = model.mtp
    emb = model.embed(ids)  # (1, T, H)
    mix = lambda h, e: head.fc(torch.cat([head.pre_fc_norm_embedding(e), head.pre_fc_norm_hidden(h)], -1))  # noqa: E731
    refresh = mix(hidden[:, : t + 1], emb[:, 1: t + 2])  # (1, t+1, H): depth-1 inputs at positions 0..t
    out1 = head.norm(_layer_last(model, refresh))  # (1, H): after mtp.norm
    step2 = mix(out1[:, None], emb[:, t + 2: t + 3])  # (1, 1, H): depth 2 at position t+1
    out2 = head.norm(_layer_last(model, torch.cat([refresh, step2], dim=1)))
    return model.lm_head(out1)[0], model.lm_head(out2)[0]


def test_trunk_hidden_is_after_the_final_norm(hf_model_dir):
    hf, path = hf_model_dir
    model = load_model(path)
    ids = torch.randint(0, 100, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = hf.model(ids).last_hidden_state  # transformers: after model.norm
        assert torch.allclose(model(ids), expected, atol=1e-4)


def test_draft_logits_follow_vllm_post_norm_chaining(hf_model_dir):
    _, path = hf_model_dir
    model = _headed(path)
    ids = torch.randint(0, 100, (1, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        hidden = model(ids)  # (1, T, H)
        outs = chain_forward(model.mtp, hidden, [model.embed(shifted(ids, d, 0)) for d in (1, 2)])
        for t in (0, 4, 11):
            ref1, ref2 = _reference_logits(model, ids, t, hidden)
            assert torch.allclose(model.mtp_logits(outs[0][0, t]), ref1, atol=1e-4), t
            assert torch.allclose(model.mtp_logits(outs[1][0, t]), ref2, atol=1e-4), t
