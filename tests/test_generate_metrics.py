"""`bebop generate` metrics in every mode (throughput; acceptance and the k histogram with --spec)
and the bad-input errors of --k auto / --max-k."""

import json
import shutil

import pytest
import torch

from bebop.cli import main
from bebop.model import load_model
from bebop.model.checkpoint import save_model

PROMPTS = ["Q: 12 + 7 = ?", "hello world", "a"]


@pytest.fixture(scope="module")
def head_model_dir(tiny_model_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("with_head")
    shutil.copytree(tiny_model_dir, path, dirs_exist_ok=True)
    model = load_model(path)
    model.attach_mtp(1, torch.Generator().manual_seed(0))
    save_model(model, path)
    return path


def _generate(model_dir, tmp_path, *flags):
    argv = ["generate", "--model", str(model_dir), "--max-new-tokens", "12", "--temperature", "0",
            "--out", str(tmp_path / "out.jsonl"), "--metrics-out", str(tmp_path / "m.json"), *flags]
    for p in PROMPTS:
        argv += ["--prompt", p]
    return main(argv)


@pytest.mark.parametrize("flags", [(), ("--spec", "rs", "--k", "2"), ("--spec", "to", "--k", "auto", "--max-k", "3")])
def test_throughput_in_every_mode(head_model_dir, tmp_path, flags):
    assert _generate(head_model_dir, tmp_path, *flags) == 0
    metrics = json.loads((tmp_path / "m.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert metrics["generated_tokens"] == sum(len(r["token_ids"]) for r in rows) > 0
    assert metrics["elapsed_s"] > 0
    assert metrics["tokens_per_s"] == pytest.approx(metrics["generated_tokens"] / metrics["elapsed_s"])
    if "auto" in flags:
        assert metrics["k"] == 3 and sum(sum(c.values()) for c in metrics["k_histogram"].values()) > 0
        assert {int(k) for c in metrics["k_histogram"].values() for k in c} <= {0, 1, 2, 3}


def test_auto_output_equals_plain_greedy(head_model_dir, tmp_path):
    assert _generate(head_model_dir, tmp_path) == 0
    plain = (tmp_path / "out.jsonl").read_text()
    assert _generate(head_model_dir, tmp_path, "--spec", "rs", "--k", "auto") == 0
    assert (tmp_path / "out.jsonl").read_text() == plain


@pytest.mark.parametrize("flags,needle", [
    (("--k", "auto"), "--k auto"),  # --spec off
    (("--spec", "rs", "--k", "auto", "--max-k", "9"), "--max-k"),
    (("--spec", "rs", "--k", "auto", "--max-k", "0"), "--max-k"),
    (("--spec", "rs", "--k", "deep"), "--k"),
    (("--spec", "rs", "--k", "0"), "K"),
])
def test_bad_speculation_flags(head_model_dir, tmp_path, capsys, flags, needle):
    try:
        code = _generate(head_model_dir, tmp_path, *flags)
    except SystemExit as exc:  # a value its flag cannot parse: argparse's usage error, naming the flag
        code = exc.code
        usage, err = capsys.readouterr().err.strip().rsplit("\n", 1)
        assert usage.startswith("usage: ") and err.startswith("bebop generate: error: argument --k: --k must be")
    else:
        err = capsys.readouterr().err.strip()
        assert err.startswith("error:") and "\n" not in err
    assert code == 2 and needle in err
    assert not (tmp_path / "out.jsonl").exists() and not (tmp_path / "m.json").exists()


def test_auto_without_a_head(tiny_model_dir, tmp_path, capsys):
    assert _generate(tiny_model_dir, tmp_path, "--spec", "rs", "--k", "auto") == 2
    assert "mtp init" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("flags", [(), ("--spec", "rs", "--k", "2")])
def test_ignore_eos_runs_every_row_to_max_new_tokens(head_model_dir, tmp_path, flags):
    """vLLM's ignore_eos: the stop tokens are sampled like any other (T=1 on a tiny random model stops
    some rows early without the flag) and every row runs to --max-new-tokens."""
    base = ["--temperature", "1", "--seed", "3", "--max-new-tokens", "40", *flags]
    finish = {}
    for extra in ((), ("--ignore-eos",)):
        assert _generate(head_model_dir, tmp_path, *base, *extra) == 0
        rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
        finish[extra] = [(r["finish_reason"], len(r["token_ids"])) for r in rows]
    assert finish[("--ignore-eos",)] == [("length", 40)] * len(PROMPTS)
    assert any(reason == "stop" for reason, _ in finish[()])
