"""CLI flags generated from the config dataclasses: every field reachable, defaults shown, --config
files with flags on top, clear errors; `bebop --version`."""

import dataclasses
import json

import pytest

from bebop import __version__
from bebop.cli import build_parser, main
from bebop.commands.config_flags import config_values, flag_fields
from bebop.errors import BebopError
from bebop.fields import flat_dict, from_flat, leaf_fields
from bebop.mtp.train_config import MTPTrainConfig
from bebop.rl.config import RLConfig
from bebop.sft import SFTConfig

COMMANDS = [(["rl"], RLConfig), (["sft"], SFTConfig), (["mtp", "train"], MTPTrainConfig)]


@pytest.mark.parametrize("command,cls", COMMANDS)
def test_every_field_is_a_flag_with_its_default_in_help(command, cls, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([*command, "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    no_flag = {f.name for f, _ in leaf_fields(cls)} - {f.name for f, _ in flag_fields(cls)}
    assert no_flag <= {"model_overrides"}  # only the tests' tuple of model sizes has none
    for field, _ in flag_fields(cls):
        assert f"--{field.name.replace('_', '-')} " in text, field.name
        assert field.metadata.get("help"), f"{cls.__name__}.{field.name} has no help text"
    for name in ("weight_decay", "grad_clip", "is_cap", "mtp_grad_clip", "batch_size"):  # once unreachable
        if name in {f.name for f in dataclasses.fields(cls)}:
            assert f"--{name.replace('_', '-')} " in text and f"(default: {getattr(cls(), name)!r})" in text


def _rl_values(tmp_path, *flags):
    args = build_parser().parse_args(["rl", "--out", str(tmp_path / "run"), *flags])
    return config_values(RLConfig, args)


def test_a_config_file_sets_fields_and_flags_override_it(tmp_path):
    path = tmp_path / "rl.json"
    path.write_text(json.dumps({"model": "m", "task": "code", "steps": 7, "lr": 0.5, "max-staleness": 0, "k": "auto",
                                "spec": "rs"}))
    values = _rl_values(tmp_path, "--config", str(path), "--lr", "0.25", "--group-size", "8")
    assert values == {"model": "m", "task": "code", "steps": 7, "lr": 0.25, "max_staleness": 0, "k": "auto", "spec": "rs",
                      "group_size": 8}
    cfg = from_flat(RLConfig, values)
    assert (cfg.is_cap, cfg.grad_clip) == (RLConfig().is_cap, RLConfig().grad_clip)  # the rest: defaults
    toml = tmp_path / "rl.toml"
    toml.write_text('model = "m"\ntask = "math"\nsteps = 3\nclip_eps = 0.1\n')
    assert _rl_values(tmp_path, "--config", str(toml))["clip_eps"] == 0.1


def test_a_run_dir_config_json_restarts_the_same_run(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(flat_dict(RLConfig(model="m", task="agent", steps=3, ppo_epochs=2))))
    assert from_flat(RLConfig, _rl_values(tmp_path, "--config", str(path))) == RLConfig(model="m", task="agent", steps=3,
                                                                                ppo_epochs=2)


@pytest.mark.parametrize("content,suffix,message", [
    ('{"model": "m", "task": "math", "steps": 1, "learning_rate": 1}', ".json", "unknown setting.*learning_rate"),
    ('{"model": "m"', ".json", "not valid JSON"),
    ("model = ", ".toml", "not valid TOML"),
    ("[1, 2]", ".json", "must hold a table"),
    ('{"model": "m"}', ".json", "--steps required"),
])
def test_bad_config_files_are_clear_errors(tmp_path, content, suffix, message):
    path = tmp_path / f"cfg{suffix}"
    path.write_text(content)
    with pytest.raises(BebopError, match=message):
        _rl_values(tmp_path, "--config", str(path))


def test_missing_config_file_and_missing_required_flags(tmp_path, capsys):
    with pytest.raises(BebopError, match="no such file"):
        _rl_values(tmp_path, "--config", str(tmp_path / "absent.toml"))
    assert main(["rl", "--out", str(tmp_path / "run"), "--model", "m"]) == 2
    assert "--steps required" in capsys.readouterr().err
    assert main(["rl", "--out", str(tmp_path / "run"), "--model", "m", "--steps", "1"]) == 2
    assert "--task or --data required" in capsys.readouterr().err
    assert main(["sft", "--out", str(tmp_path / "run")]) == 2
    assert "--task or --data required" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_bad_flag_value_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["rl", "--out", "x", "--k", "banana"])
    assert exit_.value.code == 2 and "argument --k: --k must be 'auto'" in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--version"])
    assert capsys.readouterr().out.strip() == f"bebop {__version__}"


@pytest.mark.parametrize("make,message", [
    (lambda: RLConfig(group_size=1), "--group-size must be >= 2"),
    (lambda: from_flat(RLConfig, {"k": "auto"}), "--k auto .* needs --spec to or --spec rs"),
    (lambda: SFTConfig(steps=0), "--steps must be >= 1, got 0"),
    (lambda: SFTConfig(task="poetry"), "unknown task"),
    (lambda: MTPTrainConfig(depths=0), "--depths must be >= 1, got 0"),
])
def test_a_config_is_checked_when_it_is_made(make, message):
    with pytest.raises(BebopError, match=message):
        make()
