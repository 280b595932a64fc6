"""Our trunk against transformers' Qwen3ForCausalLM on the same random weights."""

import pytest
import torch

from bebop.model import load_model, save_model
from bebop.model.checkpoint import read_state_dict

from conftest import make_hf_model


@pytest.mark.parametrize("tie", [False, True])
def test_logits_match_transformers_float32(tmp_path, tie):
    hf = make_hf_model(seed=1, tie_word_embeddings=tie)
    hf.save_pretrained(tmp_path)
    ours = load_model(tmp_path)
    ids = torch.randint(0, hf.config.vocab_size, (3, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = hf(ids).logits
        got = ours.logits(ours(ids))
    assert (expected - got).abs().max().item() <= 1e-4


def test_bfloat16_close_to_float32(hf_model_dir):
    _, path = hf_model_dir
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = load_model(path).logits(load_model(path)(ids))
        m16 = load_model(path, dtype=torch.bfloat16)
        got = m16.logits(m16(ids))
    assert m16.dtype == torch.bfloat16
    agree = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
    assert agree > 0.9
    assert (ref.softmax(-1) - got.softmax(-1)).abs().max().item() < 0.1


def test_sharded_checkpoint_from_transformers(tmp_path):
    hf = make_hf_model(seed=2)
    hf.save_pretrained(tmp_path, max_shard_size="50KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    ours = load_model(tmp_path)
    ids = torch.randint(0, 100, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(hf(ids).logits, ours.logits(ours(ids)), atol=1e-4)


def test_save_sharded_round_trip(tmp_path, hf_model_dir):
    from bebop.model.checkpoint import to_hf_state
    _, path = hf_model_dir
    model = load_model(path)
    save_model(model, tmp_path / "sharded", max_shard_bytes=60_000)
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert not (tmp_path / "sharded" / "model.safetensors").exists()
    back = read_state_dict(tmp_path / "sharded")
    hf_state = to_hf_state(model.state_dict(), model.config)
    assert set(back) == set(hf_state)
    for name, tensor in hf_state.items():
        assert torch.equal(back[name], tensor), name
    # saving again unsharded replaces the shards and the index
    save_model(model, tmp_path / "sharded")
    assert not (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    assert not list((tmp_path / "sharded").glob("model-*-of-*.safetensors"))
    assert torch.equal(load_model(tmp_path / "sharded").lm_head.weight, model.lm_head.weight)
