"""`bebop --help` and the README's command list say what the parsers do: every flag has help, the help agrees
with the code, and the README's `## Commands` block names exactly the flags each command has."""

import argparse
import re
from pathlib import Path

import pytest

from bebop.cli import build_parser, main
from bebop.tasks import TASK_NAMES

ROOT = Path(__file__).resolve().parents[1]


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command words, parser) for bebop and every subcommand under it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, (*path, name))


COMMANDS = dict(_walk(build_parser()))


def _flag(command: str, flag: str) -> argparse.Action:
    return next(a for a in COMMANDS[tuple(command.split())]._actions if flag in a.option_strings)


def _help(command: str, flag: str) -> str:
    parser = COMMANDS[tuple(command.split())]
    action = _flag(command, flag)
    return parser._get_formatter()._expand_help(action)  # as --help prints it


def test_every_parser_refuses_abbreviations():
    assert [" ".join(path) for path, p in COMMANDS.items() if p.allow_abbrev] == []


def test_every_flag_and_argument_has_help():
    missing = [f"{' '.join(path)} {a.option_strings[0] if a.option_strings else a.dest}"
               for path, p in COMMANDS.items() for a in p._actions
               if not isinstance(a, argparse._SubParsersAction) and not (a.help or "").strip()]
    assert missing == []


@pytest.mark.parametrize("command", ["generate", "rl"])
def test_k_help_promises_only_what_parses(command):
    text = _help(command, "--k")
    assert "0 =" not in text and "1..8" in text and "auto" in text


def test_task_help_lists_the_registry():
    with_task = [" ".join(path) for path, p in COMMANDS.items() if any("--task" in a.option_strings for a in p._actions)]
    assert len(with_task) >= 7
    for command in with_task:
        text = _help(command, "--task")
        assert all(re.search(rf"\b{name}\b", text) for name in TASK_NAMES), (command, text)


def test_an_unknown_task_lists_the_tasks_a_user_can_name(capsys, tmp_path):
    assert main(["rl", "--model", str(tmp_path), "--task", "nope", "--steps", "1", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("known tasks: " + ", ".join(TASK_NAMES)), err


def test_rl_help_agrees_with_the_code():
    assert "sync mode" not in _help("rl", "--engine") and "async" in _help("rl", "--engine")
    assert "(default: on)" in _help("rl", "--dump-rollouts") and "True" not in _help("rl", "--dump-rollouts")
    assert _help("rl", "--reward").count("default") == 1


def test_sft_steps_help_names_the_steps_per_task():
    from bebop.sft import DEFAULT_STEPS

    text = _help("sft", "--steps")
    assert "DEFAULT_STEPS" not in text and all(f"{task} {n}" in text for task, n in DEFAULT_STEPS.items()), text


def _readme_commands() -> dict[tuple[str, ...], set[str]]:
    """Command words -> the flags the README's `## Commands` block names for it (its lines and their
    continuation lines, comments left out)."""
    text = (ROOT / "README.md").read_text()
    block = text.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    named: dict[tuple[str, ...], set[str]] = {}
    current = None
    for line in block.splitlines():
        if not line.startswith("    ") or line.strip().startswith("#"):
            continue
        code = line.split("#", 1)[0].strip()
        if code.startswith("bebop"):
            current = _command_words(code.split()[1:])
            named.setdefault(current, set())
        named[current] |= set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", code))
    return named


def _command_words(words: list[str]) -> tuple[str, ...]:
    path: tuple[str, ...] = ()
    for word in words:
        if (*path, word) not in COMMANDS:
            break
        path = (*path, word)
    return path


def _any_config_field(path: tuple[str, ...]) -> set[str]:
    """The generated flags the README covers with '[any XConfig field]' (the command's config dataclass)."""
    from bebop.commands.config_flags import flag_fields

    cls = COMMANDS[path].get_default("_config_class")
    block = (ROOT / "README.md").read_text().split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    if cls is None or f"[any {cls.__name__} field]" not in block:
        return set()
    return {"--" + f.name.replace("_", "-") for f, _ in flag_fields(cls)}


def test_readme_command_list_names_exactly_the_parsers_flags():
    named = _readme_commands()
    leaves = {path for path, p in COMMANDS.items()
              if not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)}
    assert set(named) - {()} == leaves  # every command is listed, and nothing else
    problems = []
    for path, flags in named.items():
        actions = [a for a in COMMANDS[path]._actions if a.option_strings and "--help" not in a.option_strings]
        known = {s for a in actions for s in a.option_strings}
        unnamed = {a.option_strings[0] for a in actions if not set(a.option_strings) & flags}
        problems += [f"bebop {' '.join(path)}: README names {f}, which does not parse" for f in sorted(flags - known)]
        problems += [f"bebop {' '.join(path)}: README omits {f}" for f in sorted(unnamed - _any_config_field(path))]
    assert problems == []
