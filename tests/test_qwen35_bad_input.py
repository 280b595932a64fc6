"""Bad Qwen3.5 input (issue 15): one line naming the problem, exit code 2."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from bebop.cli import main
from bebop.model import load_model, save_model
from bebop.tokenizer import build_char_tokenizer, save_tokenizer
from qwen35_helpers import make_hf_qwen35


@pytest.fixture(scope="module")
def qwen35_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen35_bad")
    model = make_hf_qwen35()
    model.save_pretrained(path)
    headed = load_model(path)
    headed.attach_mtp(1, torch.Generator().manual_seed(0))
    save_model(headed, path)
    save_tokenizer(build_char_tokenizer(), path)
    return path


def _generate(capsys, path):
    code = main(["generate", "--model", str(path), "--prompt", "hi", "--max-new-tokens", "3"])
    return code, capsys.readouterr().err.strip().splitlines()


def test_the_good_directory_generates(capsys, qwen35_dir):
    assert _generate(capsys, qwen35_dir)[0] == 0


@pytest.mark.parametrize("change,needle", [
    ({"model_type": "qwen3_next"}, "model_type 'qwen3_next' is not supported"),
    ({"model_type": "qwen3_5_moe_text", "num_experts": 2, "num_experts_per_tok": 3},
     "num_experts_per_tok (3) exceeds num_experts (2)"),
    ({"layer_types": ["linear_attention", "full_attention", "linear_attention"]}, "layer_types has 3 entries"),
    ({"layer_types": ["linear_attention", "sliding_attention", "full_attention", "full_attention"]},
     "unknown layer type(s) sliding_attention"),
    ({"linear_num_value_heads": 3}, "linear_num_value_heads (3) is not a multiple of linear_num_key_heads (2)"),
])
def test_inconsistent_config(capsys, qwen35_dir, tmp_path, change, needle):
    path = shutil.copytree(qwen35_dir, tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **change}))
    code, err = _generate(capsys, path)
    assert code == 2 and len(err) == 1 and needle in err[0], err


@pytest.mark.parametrize("name,tensor,needle", [
    ("model.layers.2.linear_attn.A_log", None, "missing tensor 'model.layers.2.linear_attn.A_log'"),
    ("mtp.fc.weight", torch.zeros(64, 64), "tensor 'mtp.fc.weight' has shape (64, 64), the config implies (64, 128)"),
    ("model.layers.1.self_attn.q_proj.weight", torch.zeros(64, 64),
     "tensor 'model.layers.1.self_attn.q_proj.weight' has shape (64, 64), the config implies (128, 64)"),
])
def test_missing_or_misshapen_tensor(capsys, qwen35_dir, tmp_path, name, tensor, needle):
    path = shutil.copytree(qwen35_dir, tmp_path / "m")
    state = load_file(path / "model.safetensors")
    if tensor is None:
        del state[name]
    else:
        state[name] = tensor
    save_file(state, path / "model.safetensors")
    code, err = _generate(capsys, path)
    assert code == 2 and len(err) == 1 and needle in err[0], err


def test_mtp_train_warm_starts_from_the_checkpoints_head(qwen35_dir, tmp_path):
    """The paper's setting: a Qwen3.5 checkpoint ships its head; `bebop mtp train` trains that head
    (no `mtp init`), and the saved model keeps the family."""
    before = load_model(qwen35_dir).mtp
    out = tmp_path / "trained"
    assert main(["mtp", "train", "--model", str(qwen35_dir), "--task", "math", "--steps", "2", "--batch-size", "2",
                 "--num-samples", "4", "--max-new-tokens", "12", "--depths", "2", "--lr", "1e-4",
                 "--out", str(out)]) == 0
    after = load_model(out)
    assert after.config.model_type == "qwen3_5_text" and after.config.linear_layers
    moved = (after.mtp.fc.weight - before.fc.weight).abs().max().item()
    assert 0 < moved < 1e-2  # two small steps from the checkpoint's head, not a fresh one


@pytest.mark.parametrize("spec", [[], ["--spec", "rs", "--k", "3"]])
def test_cli_greedy_equals_transformers_greedy(qwen35_dir, tmp_path, spec):
    """Parity through the command line: `bebop generate --temperature 0` (plain, and speculative with
    the checkpoint's head) emits what transformers' greedy generate emits on the same weights."""
    from transformers import Qwen3_5ForCausalLM

    from conftest import CHAR_CODEC

    prompts = ["hello world", "Q: 12 + 7 = ?"]
    out = tmp_path / "gen.jsonl"
    args = ["generate", "--model", str(qwen35_dir), "--max-new-tokens", "16", "--temperature", "0", "--out", str(out)]
    assert main([*args, *[a for p in prompts for a in ("--prompt", p)], *spec]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(len(r["completion"]) >= 4 for r in rows), rows  # not a trivially empty comparison
    hf = Qwen3_5ForCausalLM.from_pretrained(qwen35_dir).eval()
    for prompt, row in zip(prompts, rows):
        ids = torch.tensor([CHAR_CODEC.encode(prompt)])
        with torch.no_grad():
            new = hf.generate(ids, max_new_tokens=16, do_sample=False)[0, ids.shape[1]:].tolist()
        if CHAR_CODEC.eos_id in new:
            new = new[: new.index(CHAR_CODEC.eos_id)]
        assert row["completion"] == CHAR_CODEC.decode(new), (prompt, row)
