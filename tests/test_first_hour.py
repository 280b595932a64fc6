"""A new user's first commands, run as they would run them: bad input gets one line `error: ...` and exit 2,
no traceback, and what was on disk stays as it was."""

import json
import shutil
import subprocess
import sys

import pytest
import torch

from bebop.cli import main
from bebop.engine import generate
from bebop.engine.records import FINISH_CONTEXT, FINISH_LENGTH
from bebop.engine.speculative import speculative_generate
from bebop.model import load_model
from bebop.sampling import SamplingParams


def _cli(capsys, *argv) -> tuple[int, list[str]]:
    """The exit code and the stderr lines of `bebop ARGV` (argparse's own refusals exit through SystemExit)."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err.strip().splitlines()


def _snapshot(path) -> dict:
    """Every file under `path` (or `path` itself): its bytes and mtime, to see that nothing was touched."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in files}


def _refused(code: int, err: list[str]) -> str:
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in err[0], err
    return err[0]


@pytest.fixture()
def model_dir(tiny_model_dir, tmp_path):
    return shutil.copytree(tiny_model_dir, tmp_path / "m")


@pytest.mark.parametrize("command", [["init"], ["rl", "--task", "math", "--steps", "1", "--model", "MODEL"],
                                     ["sft", "--task", "math", "--steps", "1"]])
def test_out_that_is_a_file_is_refused(command, model_dir, tmp_path, capsys):
    out = tmp_path / "afile"
    out.write_text("keep me\n")
    before = _snapshot(out)
    argv = [str(model_dir) if a == "MODEL" else a for a in command]
    line = _refused(*_cli(capsys, *argv, "--out", out))
    assert f"--out {out} is a file" in line
    assert _snapshot(out) == before


def test_init_over_a_model_needs_force(tmp_path, capsys):
    out = tmp_path / "m"
    assert _cli(capsys, "init", "--out", out)[0] == 0
    before = _snapshot(out)
    line = _refused(*_cli(capsys, "init", "--out", out, "--seed", "1"))
    assert f"--out {out} already holds a model" in line and "--force" in line
    assert _snapshot(out) == before
    assert _cli(capsys, "init", "--out", out, "--seed", "1", "--force")[0] == 0
    assert _snapshot(out) != before


def _generate(capsys, model, *argv):
    return _cli(capsys, "generate", "--model", model, "--max-new-tokens", "3", *argv)


def test_a_prompt_that_is_not_text_is_refused(model_dir, tmp_path, capsys):
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out.jsonl"
    prompts.write_text('{"prompt": "a"}\n{"prompt": 42}\n')
    out.write_text("earlier output\n")
    before = _snapshot(out)
    line = _refused(*_generate(capsys, model_dir, "--prompts", prompts, "--out", out))
    assert f"{prompts}: row 2" in line and "'prompt'" in line and "int" in line
    assert _snapshot(out) == before


def test_an_empty_prompts_file_says_so(model_dir, tmp_path, capsys):
    prompts = tmp_path / "empty.jsonl"
    prompts.write_text("\n")
    line = _refused(*_generate(capsys, model_dir, "--prompts", prompts))
    assert line == f"error: --prompts {prompts} has no rows"


def test_rows_cut_by_the_context_say_so(model_dir, tmp_path, capsys):
    """The tiny model's context is 128 tokens: a 100-character prompt leaves 28 of the 40 asked for."""
    out, metrics = tmp_path / "out.jsonl", tmp_path / "metrics.json"
    code, err = _cli(capsys, "generate", "--model", model_dir, "--prompt", "x" * 100, "--prompt", "hi",
                     "--max-new-tokens", "40", "--ignore-eos", "--out", out, "--metrics-out", metrics)
    assert code == 0 and len(err) == 1 and err[0].startswith("warning: ") and "context" in err[0], err
    long, short = (json.loads(line) for line in out.read_text().splitlines())
    assert (long["finish_reason"], len(long["token_ids"])) == (FINISH_CONTEXT, 128 - 100)
    assert (short["finish_reason"], len(short["token_ids"])) == (FINISH_LENGTH, 40)  # its own room, not the batch's


def test_both_engines_cut_rows_by_the_same_rule(spec_model):
    """The plain and the speculative engine give each row its own room before the context's end."""
    context = spec_model.config.max_position_embeddings
    prompts = [[5] * (context - 10), [6] * 4]
    common = dict(max_new_tokens=30, sampling=SamplingParams(0.0))
    plain = generate(spec_model, prompts, **common)
    spec, _ = speculative_generate(spec_model, prompts, k=3, mode="rs", **common)
    for gens in (plain, spec):
        assert [(g.finish_reason, len(g.token_ids)) for g in gens] == [(FINISH_CONTEXT, 10), (FINISH_LENGTH, 30)]
    assert [g.token_ids for g in plain] == [g.token_ids for g in spec]  # greedy: lossless


def test_mtp_init_takes_the_readme_flags(model_dir, capsys):
    assert _cli(capsys, "mtp", "init", "--model", model_dir, "--intermediate-size", "64")[0] == 0
    assert load_model(model_dir).config.mtp_intermediate_size == 64


@pytest.mark.parametrize("argv,usage", [(["generate", "--model", "M", "--max-new-tokens", "3", "--temp", "0"],
                                         "usage: bebop generate"),
                                        (["mtp", "init", "--model", "M", "--num-layer", "2"], "usage: bebop mtp init"),
                                        (["rl", "--out", "R", "--bogus"], "usage: bebop rl")])
def test_unknown_or_abbreviated_flags_are_refused_with_the_commands_usage(argv, usage, capsys):
    code, err = _cli(capsys, *argv)
    assert code == 2 and err[0].startswith(usage) and "Traceback" not in "\n".join(err), err
    assert err[-1].startswith(f"{usage[len('usage: '):]}: error: unrecognized arguments: --"), err


def test_a_training_state_that_is_not_a_checkpoint_is_named(model_dir, capsys):
    """sft --resume over a planted train_state.pt that is text, not a torch checkpoint."""
    (model_dir / "train_state.pt").write_text("hello\n")
    before = _snapshot(model_dir)
    line = _refused(*_cli(capsys, "sft", "--task", "math", "--out", model_dir, "--resume", "--steps", "2"))
    assert "train_state.pt" in line and "not a torch checkpoint" in line and "ValueError" not in line
    assert _snapshot(model_dir) == before


def test_a_truncated_training_state_is_named(model_dir, capsys):
    torch.save({"step": 3, "weights": torch.zeros(1000)}, model_dir / "train_state.pt")
    data = (model_dir / "train_state.pt").read_bytes()
    (model_dir / "train_state.pt").write_bytes(data[: len(data) // 2])
    line = _refused(*_cli(capsys, "sft", "--task", "math", "--out", model_dir, "--resume", "--steps", "2"))
    assert f"{model_dir / 'train_state.pt'}" in line and "cut short" in line.split("train_state.pt", 1)[1]


def test_loading_a_model_imports_no_compiler(tiny_model_dir):
    """A model is loaded into a skeleton built on the meta device; nn.Embedding's random fill there would import
    dynamo, most of a second of every command's start (eager ones included). In a process of its own."""
    code = ("import sys; from bebop.model import load_model; load_model(sys.argv[1]); "
            "print('torch._dynamo' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code, str(tiny_model_dir)], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr[-2000:]
