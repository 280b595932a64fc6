"""Heads the engines load unchanged (issue 15, part 5): a saved Qwen3.5 model keeps its family, its
declared dtype and its sharding, and its head has exactly the names and shapes that vLLM's Qwen3.5
MTP loader reads; a training run resumed from a rounded (bfloat16) directory is still exact."""

import json

import pytest
import torch

from bebop.model import load_model, save_model
from bebop.model.checkpoint import read_state_dict
from bebop.mtp.train import train_mtp
from bebop.mtp.train_config import MTPTrainConfig
from bebop.tokenizer import build_char_tokenizer, save_tokenizer
from qwen35_helpers import make_hf_qwen35


@pytest.fixture(scope="module")
def bf16_sharded(tmp_path_factory):
    """A Qwen3.5 text model saved by transformers in bfloat16 over several shards, with a head."""
    path = tmp_path_factory.mktemp("qwen35_bf16")
    headed = load_model_from_hf(path)
    save_model(headed, path, max_shard_bytes=60_000)
    save_tokenizer(build_char_tokenizer(), path)
    return path


def load_model_from_hf(path):
    make_hf_qwen35().to(torch.bfloat16).save_pretrained(path, max_shard_size="60KB")
    model = load_model(path)
    model.attach_mtp(1, torch.Generator().manual_seed(0))
    return model


def vllm_qwen35_mtp_names(cfg) -> dict[str, tuple[int, ...]]:
    """Written down from vLLM's qwen3_5_mtp.py (Qwen3_5MultiTokenPredictor and its load_weights):
    `mtp.` is remapped to `model.`; fc is Linear(2H -> H); the three norms are Qwen3_5RMSNorm(H);
    layers.{i} are Qwen3_5DecoderLayer(layer_type="full_attention"), whose q_proj also yields the
    output gate (2 x heads x head_dim rows) and whose q/k norms are per head_dim; q/k/v and gate/up are
    stacked by its stacked_params_mapping from the checkpoint's separate names."""
    h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    names = {"model.fc.weight": (h, 2 * h), "model.norm.weight": (h,), "model.pre_fc_norm_hidden.weight": (h,),
             "model.pre_fc_norm_embedding.weight": (h,)}
    for i in range(cfg.mtp_num_hidden_layers):
        p = f"model.layers.{i}."
        names |= {p + "self_attn.q_proj.weight": (2 * hq * d, h), p + "self_attn.k_proj.weight": (hkv * d, h),
                  p + "self_attn.v_proj.weight": (hkv * d, h), p + "self_attn.o_proj.weight": (h, hq * d),
                  p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
                  p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                  p + "mlp.down_proj.weight": (h, inter), p + "input_layernorm.weight": (h,),
                  p + "post_attention_layernorm.weight": (h,)}
    return names


def test_saved_model_keeps_family_dtype_and_shards(bf16_sharded, tmp_path):
    model = load_model(bf16_sharded)  # float32 in memory
    assert model.dtype == torch.float32 and model.config.declared_dtype == "bfloat16"
    save_model(model, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == "qwen3_5_text" and config["architectures"] == ["Qwen3_5ForCausalLM"]
    assert config["mtp_num_hidden_layers"] == 1 and config["dtype"] == "bfloat16"
    assert config["layer_types"] == json.loads((bf16_sharded / "config.json").read_text())["layer_types"]
    state = read_state_dict(tmp_path / "out")
    assert {t.dtype for t in state.values()} == {torch.bfloat16}
    shards = sorted(p.name for p in (tmp_path / "out").glob("model-*-of-*.safetensors"))
    assert len(shards) == len(list(bf16_sharded.glob("model-*-of-*.safetensors"))) > 1
    assert (tmp_path / "out" / "model.safetensors.index.json").is_file()


def test_saved_head_has_the_names_and_shapes_vllm_loads(bf16_sharded, tmp_path):
    model = load_model(bf16_sharded)
    save_model(model, tmp_path / "out")
    state = read_state_dict(tmp_path / "out")
    head = {"model." + name[len("mtp."):]: tuple(t.shape) for name, t in state.items() if name.startswith("mtp.")}
    assert head == vllm_qwen35_mtp_names(model.config)
    assert "model.embed_tokens.weight" in state  # vLLM's MTP takes the embedding from the trunk's names
    # the norms are stored as w of (1 + w): a fresh head's norms are zeros, applying 1
    assert torch.count_nonzero(state["mtp.norm.weight"]) == 0


def test_mtp_train_resumes_exactly_from_a_bfloat16_directory(bf16_sharded, tmp_path):
    """The model directory holds the head in bfloat16; the resumed run continues from the float32
    masters in its train state, so it ends where the uninterrupted run ends."""
    def cfg(steps):
        return MTPTrainConfig(loss="ce", depths=2, steps=steps, batch_size=2, lr=1e-3, task="math", num_samples=4,
                              max_new_tokens=12, save_every=2)

    train_mtp(bf16_sharded, cfg(4), out=tmp_path / "straight", progress=False)
    train_mtp(bf16_sharded, cfg(2), out=tmp_path / "resumed", progress=False)  # as if killed after step 2
    state = torch.load(tmp_path / "resumed" / "mtp_train_state.pt", weights_only=False)
    state["config"]["steps"] = 4
    torch.save(state, tmp_path / "resumed" / "mtp_train_state.pt")
    assert {t.dtype for t in read_state_dict(tmp_path / "resumed").values()} == {torch.bfloat16}
    train_mtp(bf16_sharded, cfg(4), out=tmp_path / "resumed", resume=True, progress=False)
    a, b = (torch.load(tmp_path / run / "mtp_train_state.pt", weights_only=False)["head"]
            for run in ("straight", "resumed"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_rl_checkpoint_keeps_float32_masters_when_its_directory_rounds(bf16_sharded):
    from types import SimpleNamespace

    from bebop.rl import RLConfig
    from bebop.rl.drafter_alarm import DrafterAlarm
    from bebop.rl.loop import _checkpoint_state, restore_masters

    model = load_model(bf16_sharded)
    trainer = SimpleNamespace(policy=SimpleNamespace(model=model), policy_version=3,
                              par=SimpleNamespace(describe=lambda: {"world_size": 1, "parallel": "none"}))
    state = _checkpoint_state(RLConfig(model=str(bf16_sharded)), 3, 7, trainer, None, DrafterAlarm(), model, {})
    exact = {name: p.detach().clone() for name, p in model.named_parameters()}
    assert state["masters"].keys() == exact.keys()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float() + 1.0)  # what reloading the rounded directory and training on gives
    restore_masters(model, SimpleNamespace(state=state))
    assert all(torch.equal(p, exact[name]) for name, p in model.named_parameters())
    model.config = type(model.config).from_dict({**model.config.to_dict(), "dtype": "float32"})
    assert _checkpoint_state(RLConfig(model=str(bf16_sharded)), 3, 7, trainer, None, DrafterAlarm(), model,
                             {})["masters"] is None
