"""Config groups (bebop.fields.group): RLConfig's decoding settings are one nested DecodeSpec in code and flat
everywhere a user or a saved run sees them (flags, --config files, config.json), so a decoding flag is declared
once, in DecodeSpec."""

import json
from pathlib import Path

import pytest

from bebop.cli import build_parser
from bebop.decoding import DecodeSpec
from bebop.fields import flat_dict, from_flat, leaf_fields
from bebop.rl.config import RLConfig, run_identity
from bebop.train_state import with_defaults

FIXTURE = Path(__file__).parent / "data" / "report_fixture" / "rl" / "sync-rs" / "config.json"


def test_a_config_round_trips_through_its_flat_layout():
    cfg = RLConfig(model="m", steps=3, decode=DecodeSpec(spec="rs", k="auto", max_k=4, compile="off"))
    flat = flat_dict(cfg)
    assert "decode" not in flat and (flat["spec"], flat["k"], flat["max_k"], flat["compile"]) == ("rs", "auto", 4, "off")
    assert from_flat(RLConfig, json.loads(json.dumps(flat))) == cfg  # as written to config.json and read back
    assert from_flat(RLConfig, {"model": "m", "steps": 3, "decode": {"spec": "rs", "k": "auto", "max_k": 4,
                                                                     "compile": "off"}}) == cfg  # the group whole


def test_a_config_json_written_before_the_nesting_reads_back():
    """A run directory's config.json of an older tree (flat, fields missing) resumes into the nested config."""
    cfg = from_flat(RLConfig, with_defaults(RLConfig, json.loads(FIXTURE.read_text())))
    assert cfg.decode == DecodeSpec(spec="rs", k=3) and cfg.max_new_tokens == 160
    assert run_identity(flat_dict(cfg))["spec"] == "rs" and "compile" not in run_identity(flat_dict(cfg))


def test_an_unknown_setting_is_named():
    with pytest.raises(TypeError, match="draft_source"):
        from_flat(RLConfig, {"model": "m", "draft_source": "suffix"})


@pytest.mark.parametrize("command", [["generate"], ["eval"], ["rl"]])
def test_every_decoding_field_is_a_flag_of_every_command_that_decodes(command):
    """A field added to DecodeSpec becomes a flag of generate, eval and rl with its help, and reaches the command's
    DecodeSpec, with nothing else to edit."""
    parser = build_parser()
    sub = next(a for a in parser._subparsers._group_actions if command[0] in a.choices).choices[command[0]]
    flags = {a.option_strings[0]: a for a in sub._actions if a.option_strings}
    for field, _ in leaf_fields(DecodeSpec):
        action = flags.get("--" + field.name.replace("_", "-"))
        assert action is not None, (command, field.name)
        assert action.help.startswith(field.metadata["help"].replace("%", "%%")), (command, field.name)
