"""bebop.progress: a tqdm bar on a terminal; in a file, plain lines at most every INTERVAL_S seconds, no '\\r'."""

from __future__ import annotations

import io

from bebop import progress
from bebop.progress import INTERVAL_S, LineProgress, bar


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_file_gets_one_line_per_interval_and_no_carriage_return():
    out, clock = io.StringIO(), Clock()
    b = LineProgress(None, total=100, desc="sft math", unit="step", initial=0, stream=out, clock=clock)
    for _ in range(100):  # one update a second for 100 s
        clock.now += 1.0
        b.update()
        b.set_postfix(loss="0.500")
    b.close()
    b.close()  # a second close prints nothing
    text = out.getvalue()
    lines = text.splitlines()
    assert "\r" not in text and text.endswith("\n")
    assert len(lines) == 1 + int(100 / INTERVAL_S) + 1  # the start, one per interval, the end
    assert lines[0].startswith("sft math: 0/100 (0%)")
    assert lines[-1].startswith("sft math: 100/100 (100%)") and lines[-1].endswith("loss=0.500]")


def test_iterating_counts_from_initial_and_closes_at_the_end():
    out = io.StringIO()
    steps = list(bar(range(3, 10), initial=3, total=10, desc="rl math sync", unit="step", stream=out))
    assert steps == list(range(3, 10))
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("rl math sync: 3/10") and lines[-1].startswith("rl math sync: 10/10")
    assert len(lines) == 2  # a fast run: the start and the end only


def test_disabled_prints_nothing_and_a_terminal_gets_tqdm():
    out = io.StringIO()
    with bar(total=5, desc="eval", enabled=False, stream=out) as b:
        b.update(5)
    assert list(bar([1, 2], desc="eval", enabled=False, stream=out)) == [1, 2]
    assert out.getvalue() == ""
    term = Terminal()
    with bar(total=5, desc="eval", stream=term) as b:
        b.update(5)
    assert "\r" in term.getvalue()  # tqdm redraws in place on a terminal


def test_write_goes_to_stderr(capsys):
    progress.write("bebop: a warning")
    assert capsys.readouterr().err == "bebop: a warning\n"


LONG_COMMANDS = [("generate",), ("sft",), ("eval",), ("rl",), ("demo",), ("mtp", "train"), ("mtp", "eval"),
                 ("mtp", "study"), ("mtp", "diagnose")]


def test_every_long_command_takes_no_progress_with_help():
    import argparse

    from bebop.cli import build_parser

    for path in LONG_COMMANDS:
        parser = build_parser()
        for name in path:
            sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            parser = sub.choices[name]
        flag = next((a for a in parser._actions if "--no-progress" in a.option_strings), None)
        assert flag is not None and flag.help and "progress" in flag.help, path
