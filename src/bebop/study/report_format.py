"""Markdown pieces shared by the report's sections: number formats, tables, the "not run yet" line."""

from __future__ import annotations

from collections.abc import Sequence


def f3(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def f2(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def signed3(x: float) -> str:
    """+x.xxx; a value that rounds to zero is +0.000, never -0.000 (a flat fit's float noise has either sign)."""
    return f"{round(x, 3) + 0.0:+.3f}"


def slope_cell(slope: float, low: float, high: float) -> str:
    """A slope with its interval: +s [+low, +high]."""
    return f"{signed3(slope)} [{signed3(low)}, {signed3(high)}]"


def per_pos(values: Sequence[float]) -> str:
    return " / ".join(f"{v:.3f}" for v in values) if values else "n/a"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def missing(what: str) -> list[str]:
    return [f"_Not run yet: {what}._", ""]
