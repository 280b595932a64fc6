"""Layouts of a math worked solution: the ways a demonstration writes out the arithmetic.

A layout turns the start count and the moves, in the order they are applied, into lines:

    layout(start, moves, op) -> list[str] | None     (None: the layout does not fit)

A move is (verb, change): ("eats", -3) is "eats 3". `op` spaces an operator or not
(base.spaced). The compact layouts (chain, one line, arrows, gains and losses grouped) only
fit short problems, where doing several changes in one line is still simple; the verbose
ones (numbered steps, the prompt's verbs) write one line per move whatever the length, so a
worked solution grows with the number of changes: ~20 characters a change.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

Move = tuple[str, int]  # (verb as in the prompt, signed change): ("eats", -3)
Op = Callable[[str], str]
SHORT = 4  # the most moves a compact layout writes


def _signed(c: int) -> str:
    return f"+{c}" if c > 0 else f"-{-c}"


def _step(total: int, c: int, op: Op) -> str:
    """One change applied to the running total: '17 - 3 = 14' (or '17-3=14')."""
    return f"{total}{op(_signed(c)[0])}{abs(c)}{op('=')}{total + c}"


def _running(start: int, moves: tuple[Move, ...]) -> list[int]:
    """The running total before each move."""
    totals, total = [], start
    for _, c in moves:
        totals.append(total)
        total += c
    return totals


def _chain(start: int, moves: tuple[Move, ...], op: Op) -> list[str] | None:
    if len(moves) > SHORT:
        return None
    return [_step(t, c, op) for t, (_, c) in zip(_running(start, moves), moves)]


def _one_line(start: int, moves: tuple[Move, ...], op: Op) -> list[str] | None:
    if len(moves) > SHORT - 1:
        return None
    terms = "".join(f"{op(_signed(c)[0])}{abs(c)}" for _, c in moves)
    return [f"{start}{terms}{op('=')}{start + sum(c for _, c in moves)}"]


def _arrows(start: int, moves: tuple[Move, ...], op: Op) -> list[str] | None:
    if len(moves) > SHORT:
        return None
    parts = [f"Start {start}."]
    for t, (_, c) in zip(_running(start, moves), moves):
        parts.append(f"{_signed(c)} is {t + c}.")
    return [" ".join(parts)]


def _grouped(start: int, moves: tuple[Move, ...], op: Op) -> list[str] | None:
    gains = [c for _, c in moves if c > 0]
    losses = [-c for _, c in moves if c < 0]
    if len(moves) > SHORT or not gains or not losses or start + sum(gains) - sum(losses) < 0:
        return None
    lines = []
    for label, group in (("Gain", gains), ("Loss", losses)):
        if len(group) > 1:
            lines.append(f"{label}: {op('+').join(map(str, group))}{op('=')}{sum(group)}")
    up = start + sum(gains)
    lines.append(f"{start}{op('+')}{sum(gains)}{op('=')}{up}")
    lines.append(f"{up}{op('-')}{sum(losses)}{op('=')}{up - sum(losses)}")
    return lines


def _lines(start: int, moves: tuple[Move, ...], op: Op, template: str) -> list[str]:
    """One line a move, e.g. template 'Step {i}, {verb} {k}: {eq}' -> 'Step 3, eats 3: 17 - 3 = 14'."""
    return [template.format(i=i, verb=verb, k=abs(c), eq=_step(t, c, op))
            for i, (t, (verb, c)) in enumerate(zip(_running(start, moves), moves), start=1)]


LINE_TEMPLATES = ("Step {i}: {eq}", "Step {i}, {verb} {k}: {eq}", "{verb} {k}: {eq}",
                  "{verb} {k}, so {eq}")
# drawn uniformly; repeats weigh a layout up; a layout that returns None is drawn again
LAYOUTS = (_chain, _chain, _one_line, _arrows, _grouped) + \
    tuple(partial(_lines, template=t) for t in LINE_TEMPLATES)
