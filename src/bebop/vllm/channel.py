"""JSON lines over a pair of pipes, each read and write bounded by a deadline: the client's side of the vLLM
worker's channel (worker.py), so that a worker that hangs, stops or dies is seen within a timeout, never waited
on forever.

    channel = LineChannel(read_fd, write_fd)
    channel.send({"id": 1, "op": "metrics"}, deadline)    # deadline: time.monotonic() seconds
    answer = channel.receive(deadline)                     # a dict; None at end of file (the worker exited)

TimeoutError when the deadline passes first; ValueError for a line that is not a JSON object.
"""

from __future__ import annotations

import json
import os
import select
import time

CHUNK = 1 << 16


class LineChannel:
    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd, self.write_fd = read_fd, write_fd
        os.set_blocking(write_fd, False)  # a full pipe to a stopped worker must not block the write
        self._buffer = b""

    def send(self, message: dict, deadline: float) -> None:
        data = (json.dumps(message) + "\n").encode()
        while data:
            _wait(self.write_fd, deadline, write=True)
            try:
                data = data[os.write(self.write_fd, data):]
            except BlockingIOError:
                continue

    def receive(self, deadline: float) -> dict | None:
        while b"\n" not in self._buffer:
            _wait(self.read_fd, deadline, write=False)
            chunk = os.read(self.read_fd, CHUNK)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            message = None
        if not isinstance(message, dict):
            raise ValueError(f"not a JSON object: {line[:200]!r}")
        return message

    def close(self) -> None:
        """Both ends closed, once (a closed descriptor's number may already be another file's)."""
        for fd in (self.read_fd, self.write_fd):
            if fd >= 0:
                os.close(fd)
        self.read_fd = self.write_fd = -1


def _wait(fd: int, deadline: float, *, write: bool) -> None:
    left = deadline - time.monotonic()
    ready = select.select([], [fd], [], max(left, 0))[1] if write else select.select([fd], [], [], max(left, 0))[0]
    if not ready:
        raise TimeoutError
