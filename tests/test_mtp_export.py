"""`bebop mtp export`: a Qwen3.5 model with a bebop-trained head laid out for vLLM / SGLang; a dense head refused."""

import json

import pytest
import torch

from bebop.cli import main
from bebop.model import load_model
from bebop.model.checkpoint import save_model
from qwen35_helpers import make_hf_qwen35


@pytest.fixture(scope="module")
def qwen35_headed(tmp_path_factory):
    """A transformers-saved Qwen3.5 (mrope_section in its rope parameters, as published), then a head saved by bebop."""
    path = tmp_path_factory.mktemp("q35") / "model"
    make_hf_qwen35(seed=1).save_pretrained(path)
    model = load_model(path)
    model.attach_mtp(1, torch.Generator().manual_seed(0))
    save_model(model, path)
    return path


def test_vllm_export_keeps_the_head_and_drops_mrope(qwen35_headed, tmp_path, capsys):
    before = (qwen35_headed / "config.json").read_text()
    out = tmp_path / "vllm"
    assert main(["mtp", "export", "--model", str(qwen35_headed), "--engine", "vllm", "--out", str(out), "--k", "2"]) == 0
    printed = capsys.readouterr().out
    assert '"num_speculative_tokens": 2' in printed and '"draft_sample_method": "probabilistic"' in printed
    assert "greedily" in printed  # the warning: greedy drafting is target-only
    cfg = json.loads((out / "config.json").read_text())
    assert "mrope_section" not in json.dumps(cfg) and cfg["mtp_num_hidden_layers"] == 1
    a, b = load_model(qwen35_headed).state_dict(), load_model(out).state_dict()
    assert any(n.startswith("mtp.") for n in b) and all(torch.equal(a[n], b[n]) for n in a)
    assert (qwen35_headed / "config.json").read_text() == before  # the user's directory only read


def test_sglang_export_prints_its_flags(qwen35_headed, tmp_path, capsys):
    assert main(["mtp", "export", "--model", str(qwen35_headed), "--engine", "sglang", "--out", str(tmp_path / "s")]) == 0
    printed = capsys.readouterr().out
    assert "--speculative-algorithm NEXTN --speculative-num-steps 3" in printed and "target-only" in printed


def test_a_dense_head_or_no_head_is_refused(headed, tiny_model_dir, tmp_path, capsys):
    assert main(["mtp", "export", "--model", str(headed), "--engine", "vllm", "--out", str(tmp_path / "d")]) == 2
    assert "not a dense 'qwen3' model" in capsys.readouterr().err
    assert main(["mtp", "export", "--model", str(tiny_model_dir), "--engine", "vllm", "--out", str(tmp_path / "n")]) == 2
    assert "has no MTP head" in capsys.readouterr().err
    assert not (tmp_path / "d").exists() and not (tmp_path / "n").exists()
