"""What the vllm set's tests share: the Python that has vLLM, and the skip when there is none."""

import os
import subprocess
import sys

import pytest

PYTHON = os.environ.get("BEBOP_VLLM_PYTHON", sys.executable)


def require_vllm() -> None:
    found = subprocess.run([PYTHON, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"])
    if found.returncode != 0:
        pytest.skip(f"no vLLM in {PYTHON} (bash scripts/install_vllm_cpu.sh, then BEBOP_VLLM_PYTHON=.venv-vllm/bin/python)")
