"""The README's commands run: its first run as written, through the shell; the Quickstart's test command is
verbatim in .ci/run; and the worked example of 'Your own model and data' runs as written (shrunk by appended
flags)."""

import json
import os
import re
import shlex
import subprocess
import sysconfig
from pathlib import Path

import pytest

from bebop.cli import main
from data_helpers import verl_row, with_chat_template, write_parquet

ROOT = Path(__file__).resolve().parents[1]


def _quickstart_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return [line.strip() for line in section.splitlines() if line.startswith("    ")]


def test_quickstart_has_two_commands_and_ci_runs_the_test_one():
    commands = _quickstart_commands()
    assert len(commands) == 2, commands
    assert "bebop demo" in commands[0]
    assert "pytest" in commands[1]
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert commands[1] in ci_lines


def _section_lines(title: str) -> list[str]:
    """The `bebop ...` command lines of a README section's code blocks, as written."""
    text = (ROOT / "README.md").read_text()
    section = text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    return [line.strip() for line in section.splitlines() if line.startswith("    bebop ")]


def _section_commands(title: str) -> list[list[str]]:
    """The `bebop ...` command lines of a README section's code blocks, split as a shell would."""
    return [shlex.split(line) for line in _section_lines(title)]


def test_a_first_run_runs_as_written(tmp_path):
    """The first run, each line given to the shell as a user types it, the venv's `bebop` first on PATH: each
    exits 0; init writes the model directory it promises, mtp init adds a head to it, and the speculative
    generate prints one row on stdout and its acceptance metrics on stderr. Its install line is the Quickstart's."""
    from bebop.model import load_model

    install = _quickstart_commands()[0].split(" && .venv/bin/bebop demo")[0]
    assert f"    {install} && source .venv/bin/activate\n" in (ROOT / "README.md").read_text()
    lines = _section_lines("A first run")
    argvs = [shlex.split(line) for line in lines]
    assert [argv[1] for argv in argvs] == ["init", "mtp", "generate"] and argvs[1][2] == "init", lines
    assert "--spec rs --k 3" in lines[2]
    path = f"{sysconfig.get_path('scripts')}{os.pathsep}{os.environ.get('PATH', '')}"
    done = []
    for line in lines:
        done.append(subprocess.run(line, shell=True, cwd=tmp_path, env={**os.environ, "PATH": path},
                                   capture_output=True, text=True, timeout=300))
        assert done[-1].returncode == 0, (line, done[-1].stderr)
    model_dir = tmp_path / argvs[0][argvs[0].index("--out") + 1]
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (model_dir / name).is_file(), name
    assert load_model(model_dir).mtp is not None
    rows = [json.loads(line) for line in done[2].stdout.splitlines()]
    assert len(rows) == 1 and rows[0]["finish_reason"] in ("stop", "length") and rows[0]["token_ids"]
    metrics = json.loads(done[2].stderr.strip().splitlines()[-1])
    assert metrics["k"] == 3 and metrics["num_drafts"] > 0 and metrics["k_histogram"]


def _layout_entries() -> dict[str, str]:
    """The Layout block's entries under src/bebop/: the name in each entry's first column -> the entry's text."""
    block = (ROOT / "README.md").read_text().split("## Layout\n", 1)[1].split("\n    tests/", 1)[0]
    entries: dict[str, str] = {}
    name = ""
    for line in block.splitlines():
        if line.startswith("      ") and not line.startswith("       "):
            name, _, text = line.strip().partition("  ")
            entries[name] = text
        elif name and line.strip():
            entries[name] += " " + line.strip()
    return entries


def test_layout_names_every_module_under_src_bebop():
    """Each module and package of src/bebop has an entry of its own, and each module inside a package is named
    (as FILE.py) in its package's entry."""
    package = ROOT / "src" / "bebop"
    entries = _layout_entries()
    tops = [f"{p.name}/" if p.is_dir() else p.name for p in package.iterdir()
            if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()]
    assert sorted(set(tops) - set(entries)) == []  # no entry
    assert sorted(set(entries) - set(tops)) == []  # an entry for what is not there
    unnamed = [str(f.relative_to(package)) for f in package.glob("*/**/*.py") if f.name != "__init__.py"
               and not re.search(rf"\b{re.escape(f.name)}", entries[f"{f.relative_to(package).parts[0]}/"])]
    assert unnamed == []


# what shrinks the worked example to seconds: appended flags override the README's (argparse: last wins)
SMALL = {"init": [], "train": ["--steps", "3", "--num-samples", "4", "--max-new-tokens", "8", "--batch-size", "2",
                               "--depths", "2", "--save-every", "3"],
         "diagnose": ["--k", "2", "--batch-size", "16"], "export": [],
         "rl": ["--steps", "2", "--group-size", "2", "--batch-prompts", "2", "--max-new-tokens", "8", "--k", "2",
                "--eval-every", "1", "--no-progress"]}


def _kind(argv: list[str]) -> str:
    return argv[1] if argv[1] == "rl" else argv[2]


def test_your_own_model_and_data_worked_example_runs_as_written(hf_model_dir, tmp_path, monkeypatch):
    """A Hugging Face Qwen3 directory with a chat template, a verl-format parquet file, `bebop mtp init`,
    `bebop mtp train --data`, `bebop rl --data --spec rs`, then `bebop mtp diagnose` and `bebop mtp train
    --rollouts` on its dumped rollouts: the README's commands, as written."""
    pytest.importorskip("pyarrow")
    pytest.importorskip("math_verify")
    commands = _section_commands("Your own model and data")[:5]
    assert [_kind(argv) for argv in commands] == ["init", "train", "rl", "diagnose", "train"]
    monkeypatch.chdir(tmp_path)
    with_chat_template(hf_model_dir[1], tmp_path / "Qwen3-0.6B")
    (tmp_path / "gsm8k").mkdir()
    for split, n in (("train", 6), ("test", 2)):
        write_parquet(tmp_path / "gsm8k" / f"{split}.parquet", [verl_row(f"{i}+{i}?", str(2 * i)) for i in range(n)])
    for argv in commands:
        assert main(argv[1:] + SMALL[_kind(argv)]) == 0, argv
    metrics = [json.loads(line) for line in (tmp_path / "runs/rl-gsm8k/metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and all(m["eval_reward"] is not None for m in metrics)
    assert all(m["acceptance_rate"] is not None for m in metrics)  # the rollouts were speculative
    report = json.loads((tmp_path / "runs/diagnosis/diagnosis.json").read_text())  # the RL run's own rollouts
    assert len(report["rs_acceptance_per_depth"]) == 2 and report["positions"] > 0
    assert (tmp_path / "runs/qwen3-mtp-tuned/mtp_metrics.jsonl").is_file()  # trained on the dumped token ids


def test_rollouts_from_vllm_diagnose_train_export_runs_as_written(tmp_path, monkeypatch, capsys):
    """The README's loop for rollouts from another engine: a transformers-saved Qwen3.5 with its head, vLLM's
    outputs as RequestOutput dumps (prompt_token_ids, outputs[i].token_ids), diagnose -> train -> diagnose -> export."""
    import torch

    from bebop.model import load_model
    from bebop.model.checkpoint import save_model
    from bebop.tokenizer import build_char_tokenizer, save_tokenizer
    from qwen35_helpers import make_hf_qwen35

    from conftest import CHAR_CODEC

    commands = _section_commands("Your own model and data")[5:]
    assert [_kind(argv) for argv in commands] == ["diagnose", "train", "diagnose", "export"]
    monkeypatch.chdir(tmp_path)
    make_hf_qwen35(seed=3).save_pretrained("Qwen3.5-0.8B")
    save_tokenizer(build_char_tokenizer(), tmp_path / "Qwen3.5-0.8B")
    model = load_model("Qwen3.5-0.8B")
    model.attach_mtp(1, torch.Generator().manual_seed(0))  # a published checkpoint's mtp.* head
    save_model(model, "Qwen3.5-0.8B")
    ids = torch.Generator().manual_seed(1)
    for name, n in (("vllm_outputs.jsonl", 6), ("vllm_held_out.jsonl", 3)):
        rows = [{"prompt_token_ids": CHAR_CODEC.encode(f"{i}+{i}="),
                 "outputs": [{"token_ids": torch.randint(4, CHAR_CODEC.vocab_size, (12,), generator=ids).tolist()}
                             for _ in range(2)]} for i in range(n)]
        (tmp_path / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
    for argv in commands:
        assert main(argv[1:] + SMALL[_kind(argv)]) == 0, argv
    before, after = (json.loads((tmp_path / f"runs/diagnosis-{w}/diagnosis.json").read_text()) for w in ("before", "after"))
    assert before["positions"] == after["positions"] > 0
    assert before["rs_acceptance_per_depth"] != after["rs_acceptance_per_depth"]  # the trained head was diagnosed
    exported = load_model("runs/qwen35-vllm").state_dict()
    tuned = load_model("runs/qwen35-tuned").state_dict()
    assert all(torch.equal(exported[n], tuned[n]) for n in tuned) and '"num_speculative_tokens": 3' in capsys.readouterr().out
