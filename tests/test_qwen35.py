"""The Qwen3.5 hybrid trunk against transformers' Qwen3_5ForCausalLM on the same random weights:
a plain forward, prefill then token-by-token decoding, ragged batches, and rollback inside a chunk."""

import pytest
import torch

from bebop.model import load_model
from bebop.model.gated_deltanet import chunked_rule, recurrent_rule
from qwen35_helpers import make_hf_qwen35

# float32 rounding over the trunk: inference here multiplies by oneDNN's packed weights (model/packed_linear.py),
# transformers by torch's default matmul, which sum in different orders (a wrong rule is off by far more)
LOGITS_TOL = 3e-4


@pytest.fixture(scope="module")
def hf_qwen35_dir(tmp_path_factory):
    model = make_hf_qwen35()
    path = tmp_path_factory.mktemp("qwen35")
    model.save_pretrained(path)
    return model, path


def _ids(b, t, seed):
    return torch.randint(0, 100, (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("length", [1, 7, 70, 150])
def test_logits_match_transformers(hf_qwen35_dir, length):
    hf, path = hf_qwen35_dir
    ours = load_model(path)
    ids = _ids(2, length, length)
    with torch.no_grad():
        expected = hf(ids).logits
        got = ours.logits(ours(ids))
    assert (expected - got).abs().max().item() <= LOGITS_TOL


def test_chunked_and_recurrent_rules_agree():
    g = torch.Generator().manual_seed(0)
    b, h, t, dk, dv = 2, 3, 150, 8, 5
    q, k = (torch.nn.functional.normalize(torch.randn(b, h, t, dk, generator=g), dim=-1) for _ in range(2))
    v = torch.randn(b, h, t, dv, generator=g)
    gate, beta = -torch.rand(b, h, t, generator=g), torch.rand(b, h, t, generator=g)
    state = torch.randn(b, h, dk, dv, generator=g)
    out_r, states = recurrent_rule(q, k, v, gate, beta, state)
    out_c, final = chunked_rule(q, k, v, gate, beta, state)
    assert torch.allclose(out_r, out_c, atol=1e-4) and torch.allclose(states[-1], final, atol=1e-4)
    assert states.shape == (t, b, h, dk, dv)


def test_recurrent_rule_matches_the_rule_written_plainly():
    """Every position's output and state against the update written as in the docstring, state-sized temporaries
    and all; also when the states go into a given buffer that holds garbage."""
    g = torch.Generator().manual_seed(1)
    b, h, t, dk, dv = 3, 2, 5, 8, 6
    q, k = (torch.nn.functional.normalize(torch.randn(b, h, t, dk, generator=g), dim=-1) for _ in range(2))
    v = torch.randn(b, h, t, dv, generator=g)
    gate, beta = -torch.rand(b, h, t, generator=g) * 3, torch.rand(b, h, t, generator=g)
    state = torch.randn(b, h, dk, dv, generator=g)
    s, outs, states = state, [], []
    for i in range(t):
        s = gate[:, :, i, None, None].exp() * s
        delta = beta[:, :, i, None] * (v[:, :, i] - (s * k[:, :, i, :, None]).sum(-2))  # (B, H, Dv)
        s = s + k[:, :, i, :, None] * delta[:, :, None, :]
        outs.append((s * q[:, :, i, :, None]).sum(-2))
        states.append(s)
    for buffer in (None, torch.full((t, b, h, dk, dv), float("nan"))):
        out, got = recurrent_rule(q, k, v, gate, beta, state.clone(), buffer)
        assert torch.allclose(out, torch.stack(outs, 2), atol=1e-5)
        assert torch.allclose(got, torch.stack(states), atol=1e-5)


@pytest.mark.parametrize("prompt_len", [5, 140])
def test_prefill_then_decode_matches_full_forward(hf_qwen35_dir, prompt_len):
    """140 tokens > SNAPSHOT_MAX: the prefill takes the chunked form, decoding the recurrent one."""
    hf, path = hf_qwen35_dir
    ours = load_model(path)
    ids = _ids(1, prompt_len + 6, 3)
    with torch.no_grad():
        expected = hf(ids).logits  # (1, T, V)
        cache = ours.new_cache(1, prompt_len + 8)
        got = [ours.logits(ours(ids[:, :prompt_len], cache))[:, -1]]
        for t in range(prompt_len, prompt_len + 5):
            got.append(ours.logits(ours(ids[:, t: t + 1], cache))[:, -1])
    for i, logits in enumerate(got):
        assert (logits - expected[:, prompt_len - 1 + i]).abs().max().item() <= LOGITS_TOL, i


@pytest.mark.parametrize("long", [False, True])
def test_ragged_prefill_keeps_each_row_at_its_own_length(hf_qwen35_dir, long):
    hf, path = hf_qwen35_dir
    ours = load_model(path)
    lengths = [9, 3, 6] if not long else [140, 131, 135]
    ids = _ids(3, max(lengths) + 2, 4)
    counts = torch.tensor(lengths)
    with torch.no_grad():
        cache = ours.new_cache(3, max(lengths) + 4)
        ours(ids[:, : max(lengths)], cache, counts)
        nxt = torch.stack([ids[i, n] for i, n in enumerate(lengths)])[:, None]  # (3, 1): each row's next token
        got = ours.logits(ours(nxt, cache))[:, -1]
        for i, n in enumerate(lengths):
            row = torch.cat([ids[i, :n], nxt[i]])[None]
            assert (got[i] - hf(row).logits[0, -1]).abs().max().item() <= LOGITS_TOL, i


@pytest.mark.parametrize("rollbacks", [[[12, 14]], [[11, 11], [15, 15]]])
def test_rollback_inside_a_chunk_restores_the_states(hf_qwen35_dir, rollbacks):
    """As after a verify: feed 10 then 5 tokens, keep 2 (row 0) and 4 (row 1), then continue. And keep 1 of 5, then
    all 5 again: a rollback that keeps every row's whole chunk skips the selection (the states are those `advance`
    chose) unless an earlier rollback moved them."""
    hf, path = hf_qwen35_dir
    ours = load_model(path)
    ids = _ids(2, 20, 5)
    with torch.no_grad():
        cache = ours.new_cache(2, 32)
        ours(ids[:, :10], cache)
        ours(ids[:, 10:15], cache)
        for lengths in rollbacks:
            cache.rollback(torch.tensor(lengths), span=max(lengths))
        kept = rollbacks[-1]
        nxt = torch.tensor([[int(ids[i, n])] for i, n in enumerate(kept)])
        got = ours.logits(ours(nxt, cache))[:, -1]
        for i, n in enumerate(kept):
            assert (got[i] - hf(ids[i: i + 1, : n + 1]).logits[0, -1]).abs().max().item() <= LOGITS_TOL, i


def test_multimodal_checkpoint_loads_its_text_model_and_head(hf_qwen35_dir, tmp_path, capsys):
    """The published layout: config nests text_config, weights under model.language_model.*, a vision
    tower beside them, the MTP head's mtp.* at the top. Loaded: the text model and its head, the tower
    skipped with a note. Saved back: the same nesting, names and head."""
    import json

    from safetensors.torch import save_file

    from bebop.model import save_model
    from bebop.model.checkpoint import read_state_dict

    hf, path = hf_qwen35_dir
    headed = load_model(path)
    headed.attach_mtp(1, torch.Generator().manual_seed(0))
    save_model(headed, tmp_path / "flat")
    flat = read_state_dict(tmp_path / "flat")
    nested = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v for k, v in flat.items()}
    nested["model.visual.patch_embed.proj.weight"] = torch.zeros(4, 3)
    mm = tmp_path / "mm"
    mm.mkdir()
    save_file(nested, str(mm / "model.safetensors"))
    text = json.loads((path / "config.json").read_text())
    (mm / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
                                                "text_config": {**text, "mtp_num_hidden_layers": 1},
                                                "vision_config": {"depth": 2}, "tie_word_embeddings": False}))
    model = load_model(mm)
    assert "vision tower (1 tensors)" in capsys.readouterr().err
    assert model.mtp is not None and model.config.linear_layers
    ids = _ids(1, 12, 9)
    with torch.no_grad():
        assert (model.logits(model(ids)) - hf(ids).logits).abs().max().item() <= LOGITS_TOL
        assert torch.equal(model.mtp.fc.weight, headed.mtp.fc.weight)
    save_model(model, tmp_path / "back")
    back = json.loads((tmp_path / "back" / "config.json").read_text())
    assert back["model_type"] == "qwen3_5" and back["text_config"]["model_type"] == "qwen3_5_text"
    assert back["vision_config"] == {"depth": 2} and back["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    names = set(read_state_dict(tmp_path / "back"))
    assert "model.language_model.norm.weight" in names and "mtp.fc.weight" in names
    assert not any(n.startswith("model.layers.") for n in names)
    assert torch.equal(load_model(tmp_path / "back").mtp.fc.weight, headed.mtp.fc.weight)


@pytest.fixture(scope="module")
def hf_moe_dir(tmp_path_factory):
    model = make_hf_qwen35(seed=1, moe=True)
    path = tmp_path_factory.mktemp("qwen35_moe")
    model.save_pretrained(path)
    return model, path


@pytest.mark.parametrize("length", [1, 9, 70])
def test_moe_logits_match_transformers(hf_moe_dir, length):
    hf, path = hf_moe_dir
    ours = load_model(path)
    assert ours.config.num_experts == 4 and ours.config.model_type == "qwen3_5_moe_text"
    ids = _ids(2, length, length + 1)
    with torch.no_grad():
        assert (hf(ids).logits - ours.logits(ours(ids))).abs().max().item() <= LOGITS_TOL


def test_moe_prefill_then_decode_and_save_round_trip(hf_moe_dir, tmp_path):
    from bebop.model import save_model
    from bebop.model.checkpoint import read_state_dict

    hf, path = hf_moe_dir
    ours = load_model(path)
    ids = _ids(1, 12, 7)
    with torch.no_grad():
        expected = hf(ids).logits
        cache = ours.new_cache(1, 16)
        got = [ours.logits(ours(ids[:, :8], cache))[:, -1]]
        for t in range(8, 11):
            got.append(ours.logits(ours(ids[:, t: t + 1], cache))[:, -1])
    for i, logits in enumerate(got):
        assert (logits - expected[:, 7 + i]).abs().max().item() <= LOGITS_TOL, i
    save_model(ours, tmp_path / "back")
    assert set(read_state_dict(tmp_path / "back")) == set(read_state_dict(path))  # per-expert names, as read


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_one_plus_w_norm_equals_transformers_in_every_dtype(dtype):
    """Qwen3_5RMSNorm forms (1 + w) and the product in float32 and casts once (issue 23): bit-equal here
    in every dtype (forming 1 + w in bfloat16 rounds nearby scales together: not equal)."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm

    from bebop.model.layers import RMSNorm

    g = torch.Generator().manual_seed(0)
    hf, ours = Qwen3_5RMSNorm(1024, eps=1e-6), RMSNorm(1024, 1e-6, offset=1.0)
    with torch.no_grad():
        hf.weight.copy_(torch.randn(1024, generator=g) * 0.05)
        ours.weight.copy_(hf.weight)
    hf, ours = hf.to(dtype), ours.to(dtype)
    x = torch.randn(3, 5, 1024, generator=g).to(dtype)
    with torch.no_grad():
        assert torch.equal(ours(x), hf(x))
