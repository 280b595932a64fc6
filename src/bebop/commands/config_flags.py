"""Command-line flags generated from a config dataclass, so that no flag is retyped by hand and no
field is out of reach.

    add_config_flags(parser, RLConfig, required=("model", "task", "steps"))
    values = config_values(RLConfig, args)     # fields set by --config FILE, then by flags
    cfg = from_flat(RLConfig, values)          # a group's fields (RLConfig.decode: --spec, --k, ...) nested back

Every int / float / str field (or one with a `parse` function in its metadata) becomes
`--field-name` (a nested group's fields too: bebop.fields.group), with the help text and choices of
its metadata (see bebop.fields.opt) and its default shown in --help. `--config FILE` (TOML or JSON,
keys = field names with - or _) sets fields; a flag given on the command line overrides the file; what neither sets keeps the
dataclass default. A field in `required` must come from one of the two. The dataclass checks the
values when it is constructed (`__post_init__` -> `validate`), so flags, files and the Python API
meet the same checks.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from pathlib import Path
from typing import Any

from bebop.errors import BebopError
from bebop.fields import from_flat, leaf_fields, parse_switch

SIMPLE_TYPES = {int: int, float: float, str: str}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _parser_of(field: dataclasses.Field, hint: Any):
    """The function that turns a flag's text into the field's value, or None (no flag)."""
    parse = field.metadata.get("parse")
    return _as_argument_type(parse) if parse else SIMPLE_TYPES.get(hint)


def _as_argument_type(parse):
    """argparse reports a type function's ArgumentTypeError as a usage error (exit 2), not a BebopError."""
    def convert(text: str):
        try:
            return parse(text)
        except BebopError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__
    return convert


def flag_fields(cls) -> list[tuple[dataclasses.Field, Any]]:
    """(field, parse function) for every field of `cls` (a group's fields in its place) that has a flag."""
    pairs = [(f, _parser_of(f, typing.get_type_hints(owner)[f.name])) for f, owner in leaf_fields(cls)]
    return [(f, parse) for f, parse in pairs if parse is not None]


def add_field_flags(parser: argparse.ArgumentParser, cls, *, required: tuple[str, ...] = (),
                    only: tuple[str, ...] | None = None, suppress: bool = False) -> None:
    """A flag for each of `cls`'s fields (those named in `only`), defaulting to the field's default, or left unset
    (`suppress`: a --config file may set it)."""
    for field, parse in flag_fields(cls):
        if only is not None and field.name not in only:
            continue
        help_text = field.metadata.get("help", "")
        if field.name in required:
            help_text += " (required)"
        elif "(default:" not in help_text:  # a help that says its default in words keeps its words
            help_text += f" (default: {_shown(field, field.default)})"
        parser.add_argument(_flag(field.name), type=parse, default=argparse.SUPPRESS if suppress else field.default,
                            choices=field.metadata.get("choices"), help=help_text.replace("%", "%%").lstrip())


def fields_from_args(cls, args: argparse.Namespace):
    """A `cls` from the flags add_field_flags made (fields without one keep their defaults); checked when made."""
    return from_flat(cls, {f.name: getattr(args, f.name) for f, _ in flag_fields(cls) if hasattr(args, f.name)})


def add_config_flags(parser: argparse.ArgumentParser, cls, *, required: tuple[str, ...] = ()) -> None:
    add_field_flags(parser, cls, required=required, suppress=True)
    parser.add_argument("--config", type=Path, default=None,
                        help="a TOML or JSON file of these settings (keys = flag names); flags override it")
    parser.set_defaults(_config_class=cls, _required=required)


def _shown(field: dataclasses.Field, value: Any) -> str:
    """A default as a user would type it: on/off for a switch."""
    if field.metadata.get("parse") is parse_switch:
        return "on" if value else "off"
    return repr(value)


def read_config_file(path: Path, cls) -> dict[str, Any]:
    """The settings in a TOML / JSON file, keys normalised to field names and checked against `cls`."""
    if not path.is_file():
        raise BebopError(f"--config {path}: no such file")
    text = path.read_text(encoding="utf-8")
    try:
        raw = json.loads(text) if path.suffix == ".json" else _toml(text)
    except ValueError as exc:  # json.JSONDecodeError and tomllib.TOMLDecodeError are ValueErrors
        raise BebopError(f"--config {path} is not valid {'JSON' if path.suffix == '.json' else 'TOML'}: {exc}") from None
    if not isinstance(raw, dict):
        raise BebopError(f"--config {path} must hold a table of settings, got {type(raw).__name__}")
    names = {f.name for f, _ in leaf_fields(cls)}
    values = {key.replace("-", "_"): value for key, value in raw.items()}
    unknown = sorted(set(values) - names)
    if unknown:
        raise BebopError(f"--config {path}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
    return values


def _toml(text: str) -> dict:
    try:
        import tomllib  # Python >= 3.11
    except ImportError:
        raise BebopError("a TOML --config needs Python 3.11 or later; use a .json file") from None
    return tomllib.loads(text)


def config_values(cls, args: argparse.Namespace) -> dict[str, Any]:
    """The fields set by --config and by flags (flags win); the required ones checked."""
    values = read_config_file(args.config, cls) if args.config is not None else {}
    values.update({f.name: getattr(args, f.name) for f, _ in flag_fields(cls) if hasattr(args, f.name)})
    missing = [name for name in args._required if name not in values]
    if missing:
        raise BebopError(f"{', '.join(_flag(m) for m in missing)} required (as a flag or in --config)")
    return values


def require_one_of(values: dict[str, Any], names: tuple[str, ...]) -> None:
    """At least one of `names` must be set (as a flag or in --config), e.g. --task or --data."""
    if not any(values.get(name) for name in names):
        raise BebopError(f"{' or '.join(_flag(n) for n in names)} required (as a flag or in --config)")
