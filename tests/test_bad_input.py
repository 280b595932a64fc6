"""Bad input gets one clear line and a non-zero exit, never a traceback from deep inside."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from bebop.cli import main
from bebop.model import load_model, save_model
from bebop.tokenizer import build_char_tokenizer, save_tokenizer


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _run(capsys, *argv):
    code = main(["generate", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


def _gen_args(path, *extra):
    return ["--model", str(path), "--prompt", "hi", "--max-new-tokens", "3", *extra]


def test_missing_model_dir(capsys, tmp_path):
    code, err = _run(capsys, *_gen_args(tmp_path / "nope"))
    assert code == 2 and err == [f"error: model directory not found: {tmp_path / 'nope'}"]


def test_missing_config(capsys, tiny_model_dir, tmp_path):
    path = _copy(tiny_model_dir, tmp_path / "m")
    (path / "config.json").unlink()
    code, err = _run(capsys, *_gen_args(path))
    assert code == 2 and len(err) == 1 and "no config.json" in err[0]


@pytest.mark.parametrize("text,needle", [("{not json", "not valid JSON"), ('{"vocab_size": 10}', "missing required"),
                                         ("[1, 2]", "JSON object")])
def test_malformed_config(capsys, tiny_model_dir, tmp_path, text, needle):
    path = _copy(tiny_model_dir, tmp_path / "m")
    (path / "config.json").write_text(text)
    code, err = _run(capsys, *_gen_args(path))
    assert code == 2 and len(err) == 1 and needle in err[0]


def test_missing_tensor_is_named(capsys, tiny_model_dir, tmp_path):
    path = _copy(tiny_model_dir, tmp_path / "m")
    state = load_file(path / "model.safetensors")
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, path / "model.safetensors")
    code, err = _run(capsys, *_gen_args(path))
    assert code == 2 and len(err) == 1
    assert "missing tensor 'model.layers.1.mlp.up_proj.weight'" in err[0] and "(128, 64)" in err[0]


def test_wrong_shape_names_key_and_both_shapes(capsys, tiny_model_dir, tmp_path):
    path = _copy(tiny_model_dir, tmp_path / "m")
    state = load_file(path / "model.safetensors")
    state["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(16, 64)
    save_file(state, path / "model.safetensors")
    code, err = _run(capsys, *_gen_args(path))
    assert code == 2 and len(err) == 1
    assert "'model.layers.0.self_attn.k_proj.weight'" in err[0] and "(16, 64)" in err[0] and "(32, 64)" in err[0]


def test_corrupt_checkpoint(capsys, tiny_model_dir, tmp_path):
    path = _copy(tiny_model_dir, tmp_path / "m")
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 3])
    code, err = _run(capsys, *_gen_args(path))
    assert code == 2 and len(err) == 1 and "corrupt checkpoint" in err[0]


def test_tokenizer_larger_than_model_vocab(capsys, tiny_model_dir, tmp_path):
    path = _copy(tiny_model_dir, tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    cfg["vocab_size"] = 50
    (path / "config.json").write_text(json.dumps(cfg))
    state = load_file(path / "model.safetensors")
    state["model.embed_tokens.weight"] = state["model.embed_tokens.weight"][:50].contiguous()
    save_file(state, path / "model.safetensors")
    code, err = _run(capsys, *_gen_args(path))
    assert code == 2 and len(err) == 1 and "vocab mismatch" in err[0] and "103" in err[0]


def test_prompt_longer_than_context(capsys, tiny_model_dir):
    code, err = _run(capsys, "--model", str(tiny_model_dir), "--prompt", "x" * 200, "--max-new-tokens", "3")
    assert code == 2 and len(err) == 1 and "200 tokens" in err[0] and "context is 128" in err[0]


def test_empty_prompt(capsys, tiny_model_dir):
    code, err = _run(capsys, "--model", str(tiny_model_dir), "--prompt", "", "--max-new-tokens", "3")
    assert code == 2 and err == ["error: prompt 0 is empty"]


def test_prompts_file_missing_key(capsys, tiny_model_dir, tmp_path):
    (tmp_path / "p.jsonl").write_text('{"prompt": "a"}\n{"text": "b"}\n')
    code, err = _run(capsys, "--model", str(tiny_model_dir), "--prompts", str(tmp_path / "p.jsonl"),
                     "--max-new-tokens", "3")
    assert code == 2 and len(err) == 1 and "row 2 has no 'prompt' (or 'messages') key" in err[0]


@pytest.mark.parametrize("flag,value", [("--dtype", "float64"), ("--temperature", "hot")])
def test_unknown_flag_value(capsys, tiny_model_dir, flag, value):
    with pytest.raises(SystemExit) as exc:
        main(["generate", *_gen_args(tiny_model_dir), flag, value])
    assert exc.value.code == 2
    assert "invalid" in capsys.readouterr().err


@pytest.mark.parametrize("flag,value,needle", [("--temperature", "-1", "temperature"), ("--top-p", "0", "top_p"),
                                               ("--max-new-tokens", "0", "max-new-tokens")])
def test_out_of_range_values(capsys, tiny_model_dir, flag, value, needle):
    argv = _gen_args(tiny_model_dir)
    if flag == "--max-new-tokens":
        argv[argv.index("--max-new-tokens") + 1] = value
    else:
        argv += [flag, value]
    code, err = _run(capsys, *argv)
    assert code == 2 and len(err) == 1 and needle in err[0]


def test_interrupted_save_keeps_the_old_checkpoint(tiny_model_dir, tmp_path, monkeypatch):
    path = _copy(tiny_model_dir, tmp_path / "m")
    before = (path / "model.safetensors").read_bytes()
    model = load_model(path)
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)

    def crash(tensors, filename, metadata=None):
        with open(filename, "wb") as fh:
            fh.write(b"half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr("bebop.model.weight_files.save_file", crash)
    with pytest.raises(KeyboardInterrupt):
        save_model(model, path)
    assert (path / "model.safetensors").read_bytes() == before
    assert not [p for p in path.iterdir() if p.name.endswith(".tmp")]


def test_tokenizer_file_corrupt(capsys, tiny_model_dir, tmp_path):
    path = _copy(tiny_model_dir, tmp_path / "m")
    (path / "tokenizer.json").write_text("{}")
    code, err = _run(capsys, *_gen_args(path))
    assert code == 2 and len(err) == 1 and "tokenizer.json" in err[0]
    save_tokenizer(build_char_tokenizer(), path)
    assert _run(capsys, *_gen_args(path))[0] == 0
