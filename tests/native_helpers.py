"""The native ops as the tests ask for them: each kernel's test module makes its fixture of `built_or_skip`."""

import shutil

import pytest

from bebop.model.native import Op

HAS_TOOLCHAIN = shutil.which("c++") is not None and shutil.which("ninja") is not None


def built_or_skip(op: Op):
    """The op where the library built; a skip where no compiler or ninja is here (the callers' torch paths serve), a
    failure where they are and it did not build."""
    built = op()
    if built is None:
        assert not HAS_TOOLCHAIN, f"a compiler and ninja are here, yet {op.name} did not build"
        pytest.skip(f"no C++ compiler or ninja: {op.name}'s callers take their torch path")
    return built
