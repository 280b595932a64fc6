"""`opt`: a config dataclass field with its help text, from which the command line is generated
(bebop.commands.config_flags), so that a setting is described once, where it is defined.

    @dataclass(frozen=True)
    class RLConfig:
        steps: int = opt(50, "policy updates")
        mode: str = opt("sync", "rollouts: sync, or async (overlapping the update)", choices=MODES)
"""

from __future__ import annotations

import dataclasses
from typing import Any


def opt(default: Any, help: str, **meta: Any) -> Any:
    """A field with `default`; `help` and e.g. `choices=`, `parse=` (text -> value) go in its metadata."""
    return dataclasses.field(default=default, metadata={"help": help, **meta})
