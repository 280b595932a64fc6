"""`opt`: a config dataclass field with its help text, from which the command line is generated
(bebop.commands.config_flags), so that a setting is described once, where it is defined. `group`: a field that
nests another such dataclass (its fields keep their own flags and checks).

    @dataclass(frozen=True)
    class RLConfig:
        steps: int = opt(50, "policy updates")
        mode: str = opt("sync", "rollouts: sync, or async (overlapping the update)", choices=MODES)
        decode: DecodeSpec = group(DecodeSpec)      # --spec, --k, --compile, ... declared in DecodeSpec

A nested group is flat everywhere a user sees it: its fields are top-level flags, top-level keys of a --config
file and of a saved config.json (`flat_dict` / `from_flat`), so that nesting changes no file a run wrote.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def opt(default: Any, help: str, **meta: Any) -> Any:
    """A field with `default`; `help` and e.g. `choices=`, `parse=` (text -> value) go in its metadata."""
    return dataclasses.field(default=default, metadata={"help": help, **meta})


def group(cls: type) -> Any:
    """A field holding a `cls` dataclass (its defaults unless given), whose fields are flat in flags and files."""
    return dataclasses.field(default_factory=cls, metadata={"group": cls})


def like(cls, name: str) -> Any:
    """A field declared as `cls`'s field `name` (its default, help and choices), for a config that takes that one
    setting of a group and not the others."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return dataclasses.field(default=f.default, metadata=f.metadata)


def leaf_fields(cls) -> list[tuple[dataclasses.Field, type]]:
    """(field, the dataclass that declares it) for every field of `cls`, a group's fields in its place."""
    out: list[tuple[dataclasses.Field, type]] = []
    for f in dataclasses.fields(cls):
        inner = f.metadata.get("group")
        out += leaf_fields(inner) if inner else [(f, cls)]
    return out


def flat_dict(cfg) -> dict[str, Any]:
    """dataclasses.asdict with each group's fields lifted to the top level (the layout of a saved config)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        out.update(flat_dict(value) if f.metadata.get("group") else {f.name: value})
    return out


def from_flat(cls, values: dict[str, Any]):
    """A `cls` from flat settings (a group's fields at the top level, or the group given whole as a dict or an
    instance); what `values` leaves out keeps its default. Unknown keys are a TypeError, as for cls(**values)."""
    values, kwargs = dict(values), {}
    for f in dataclasses.fields(cls):
        inner = f.metadata.get("group")
        if inner is None:
            if f.name in values:
                kwargs[f.name] = values.pop(f.name)
            continue
        given = values.pop(f.name, None)
        if dataclasses.is_dataclass(given):
            kwargs[f.name] = given
            continue
        own = {g.name for g, _ in leaf_fields(inner)} | {g.name for g in dataclasses.fields(inner)}
        kwargs[f.name] = from_flat(inner, {**(given or {}), **{k: values.pop(k) for k in list(values) if k in own}})
    if values:
        raise TypeError(f"{cls.__name__} got unexpected setting(s) {', '.join(sorted(values))}")
    return cls(**kwargs)


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
