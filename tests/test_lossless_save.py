"""A model comes back as it was given (issue 23): a save keeps what it does not change.

The checkpoint is laid out as published Qwen3.5 ones are (tests/qwen35_helpers.save_hf_multimodal):
a vision tower beside the text model, bfloat16 with float32 A_log and gated norms, sharded, the dtype
declared at the outer level only. `bebop mtp init` and `bebop mtp train` write in place; afterwards
every tensor is still there with its dtype, everything outside mtp.* bit-identical, every config key
kept, and transformers loads the directory with no missing key and the tower as it was.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from bebop.cli import main
from bebop.model import load_model, save_model
from bebop.model.checkpoint import read_state_dict
from bebop.tokenizer import build_char_tokenizer, save_tokenizer
from qwen35_helpers import KEPT_IN_FLOAT32, save_hf_multimodal


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen35_mm")
    save_hf_multimodal(path)
    save_tokenizer(build_char_tokenizer(), path)
    return path


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical: the same dtype, shape and bytes."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def keys_kept(before, after, path="") -> list[str]:
    """Keys (nested) of `before` that `after` lacks or holds another value for."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        return [] if before == after else [path]
    return [bad for k, v in before.items()
            for bad in ([f"{path}{k}"] if k not in after else keys_kept(v, after[k], f"{path}{k}."))]


def test_the_fixture_is_laid_out_as_published_checkpoints_are(published):
    state = read_state_dict(published)
    assert any(n.startswith("model.visual.") for n in state) and len(list(published.glob("model-*.safetensors"))) > 1
    assert {t.dtype for n, t in state.items() if n.endswith(KEPT_IN_FLOAT32)} == {torch.float32}
    assert {t.dtype for n, t in state.items() if not n.endswith(KEPT_IN_FLOAT32)} == {torch.bfloat16}
    config = json.loads((published / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and "dtype" not in config["text_config"]


def test_the_outer_dtype_is_the_declared_one(published):
    model = load_model(published)
    assert model.config.declared_dtype == "bfloat16"


def test_mtp_init_and_train_in_place_keep_everything_else(published, tmp_path, capsys):
    model_dir = tmp_path / "model"
    shutil.copytree(published, model_dir)
    before = read_state_dict(model_dir)
    config_before = json.loads((model_dir / "config.json").read_text())
    assert main(["mtp", "init", "--model", str(model_dir)]) == 0
    after_init = read_state_dict(model_dir)
    assert main(["mtp", "train", "--model", str(model_dir), "--loss", "e2e_tv", "--depths", "2", "--steps", "2",
                 "--batch-size", "2", "--num-samples", "4", "--max-new-tokens", "8", "--task", "math"]) == 0
    after = read_state_dict(model_dir)
    assert {n for n in after if not n.startswith("mtp.")} == set(before)
    changed = [n for n, t in before.items() if not same_tensor(t, after[n])]
    assert changed == []
    head = {n: t for n, t in after.items() if n.startswith("mtp.")}
    assert head and {t.dtype for t in head.values()} == {torch.bfloat16}  # the declared dtype
    assert any(not torch.equal(t, after_init[n]) for n, t in head.items())  # trained
    config = json.loads((model_dir / "config.json").read_text())
    assert keys_kept(config_before, config) == []
    assert config["text_config"]["mtp_num_hidden_layers"] == 1
    assert not list(model_dir.glob("*bebop-staged*"))


def test_transformers_loads_the_saved_directory_with_no_missing_key(published, tmp_path):
    from transformers import Qwen3_5ForConditionalGeneration

    model = load_model(published)
    model.attach_mtp(1, torch.Generator().manual_seed(0))
    save_model(model, tmp_path / "out")
    original = Qwen3_5ForConditionalGeneration.from_pretrained(published)
    loaded, info = Qwen3_5ForConditionalGeneration.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert info["missing_keys"] == set() or info["missing_keys"] == []
    reference = original.state_dict()
    assert all(same_tensor(t, reference[n]) for n, t in loaded.state_dict().items())


def test_a_float32_model_saved_twice_is_bit_identical(published, tmp_path):
    """Load (float32 in memory), save, load, save: the files hold the same tensors in the same dtypes."""
    save_model(load_model(published), tmp_path / "a")
    save_model(load_model(tmp_path / "a"), tmp_path / "b")
    a, b = read_state_dict(tmp_path / "a"), read_state_dict(tmp_path / "b")
    original = read_state_dict(published)
    assert set(a) == set(b) == set(original)
    assert all(same_tensor(original[n], a[n]) and same_tensor(a[n], b[n]) for n in original)


def test_a_trunk_only_save_leaves_the_head_out(headed, tmp_path):
    """save_model(with_head=False): what vLLM's dense Qwen3 loader takes (it refuses mtp.* tensors)."""
    model = load_model(headed)
    save_model(model, tmp_path / "trunk", with_head=False)
    names = set(read_state_dict(tmp_path / "trunk"))
    assert names and not any(n.startswith("mtp.") for n in names)
    trunk = load_model(tmp_path / "trunk")
    assert trunk.mtp is None and json.loads((tmp_path / "trunk" / "config.json").read_text()).get(
        "mtp_num_hidden_layers", 0) == 0
    full = model.state_dict()
    assert all(torch.equal(t, full[n]) for n, t in trunk.state_dict().items())
    assert model.mtp is not None  # the model itself keeps its head
