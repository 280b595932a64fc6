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


SWITCH = {"on": True, "true": True, "1": True, "yes": True, "off": False, "false": False, "0": False, "no": False}


def parse_switch(text: str | bool) -> bool:
    """A yes/no setting's text: on/off (true/false, 1/0, yes/no)."""
    if isinstance(text, bool):
        return text
    from bebop.errors import BebopError

    value = SWITCH.get(str(text).strip().lower())
    if value is None:
        raise BebopError(f"expected on or off, got {text!r}")
    return value
