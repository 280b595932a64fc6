"""Progress on stderr, one place for every command's bars: a tqdm bar on a terminal, and where stderr is a file
or a pipe (a log, a batch job) a plain line every INTERVAL_S seconds, never a carriage return.

    with bar(total=len(rows), desc="eval math", unit="problem", enabled=progress) as b:
        run(..., on_batch=b.update)
    for step in bar(range(start, steps), initial=start, total=steps, desc="sft math", enabled=progress):
        ...
    write("bebop: ...")   # a message that does not tear a terminal bar

`enabled=False` (the commands' --no-progress, or a rank other than 0) prints nothing.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TextIO

from tqdm import tqdm

INTERVAL_S = 5.0  # seconds between two lines in a file
LINE = "{desc}: {n_fmt}/{total_fmt} ({percentage:.0f}%) [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
LINE_NO_TOTAL = "{desc}: {n_fmt} [{elapsed}, {rate_fmt}{postfix}]"


def bar(iterable: Iterable | None = None, *, total: int | None = None, desc: str = "", unit: str = "it",
        initial: int = 0, enabled: bool = True, stream: TextIO | None = None) -> Any:
    """A progress bar over `iterable` (or advanced by .update(n)) on `stream` (default: sys.stderr now): tqdm on a
    terminal, LineProgress elsewhere, a silent tqdm when not `enabled`. Each has update, set_postfix, close and
    iteration, and is a context manager."""
    stream = sys.stderr if stream is None else stream
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    if enabled and not _is_terminal(stream):
        return LineProgress(iterable, total=total, desc=desc, unit=unit, initial=initial, stream=stream)
    return tqdm(iterable, total=total, desc=desc, unit=unit, initial=initial, disable=not enabled, file=stream)


def write(message: str) -> None:
    """A line on stderr while a bar may be showing (on a terminal the bar is redrawn below it)."""
    tqdm.write(message, file=sys.stderr)


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class LineProgress:
    """tqdm's counters as plain lines: one when it starts, one each time an update finds INTERVAL_S seconds
    passed since the last line, and one when it closes (`clock`: seconds, injectable for tests)."""

    def __init__(self, iterable: Iterable | None, *, total: int | None, desc: str, unit: str, initial: int,
                 stream: TextIO, clock: Callable[[], float] = time.monotonic) -> None:
        self.iterable, self.total, self.desc, self.unit, self.stream, self.clock = \
            iterable, total, desc, unit, stream, clock
        self.n = self.initial = initial
        self.postfix, self.closed = "", False
        self.start = self.last = clock()
        self._line(self.start)

    def __iter__(self) -> Iterator:
        try:
            for item in self.iterable or ():
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self.clock()
        if now - self.last >= INTERVAL_S:
            self._line(now)

    def set_postfix(self, **values: object) -> None:
        """Shown from the next line on (as tqdm shows `key=value, ...`)."""
        self.postfix = ", ".join(f"{key}={value}" for key, value in values.items())

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._line(self.clock())

    def _line(self, now: float) -> None:
        self.last = now
        text = tqdm.format_meter(self.n, self.total, now - self.start, prefix=self.desc, unit=self.unit,
                                 postfix=self.postfix or None, initial=self.initial,
                                 bar_format=LINE if self.total else LINE_NO_TOTAL)
        self.stream.write(text + "\n")
        self.stream.flush()
