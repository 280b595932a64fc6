"""Lint, types and layers are part of the suite (so `.ci/run` runs them): ruff over src, tests and benchmarks,
mypy over src/bebop, import-linter's contracts (packages import only the layers below them; settings in
pyproject.toml)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("tool,args", [("ruff", ["check", "src", "tests", "benchmarks"]), ("mypy", [])])
def test_clean(tool, args):
    done = subprocess.run([sys.executable, "-m", tool, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{tool} found problems:\n{done.stdout[-4000:]}{done.stderr[-2000:]}"


def test_layers_point_down():
    lint = Path(sys.executable).with_name("lint-imports")  # import-linter's command, installed beside this Python
    done = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"an import points up a layer:\n{done.stdout[-4000:]}{done.stderr[-2000:]}"
