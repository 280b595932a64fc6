"""The README's Quickstart is what CI runs: the test command appears verbatim in .ci/run."""

from pathlib import Path

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
