"""The argument parser of `bebop` and of every subcommand under it.

Flags are never abbreviated: with argparse's default `--temp 0` binds to `--temperature`, and a script's
typo binds to whichever flag it prefixes once more flags exist. A flag a subcommand does not know is
refused by that subcommand, with its own usage (argparse hands it back to the top level, whose usage
names none of the command's flags).
"""

from __future__ import annotations

import argparse


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def add_subparsers(self, **kwargs):
        kwargs.setdefault("parser_class", CommandParser)
        return super().add_subparsers(**kwargs)


class CommandParser(Parser):
    """A subcommand's parser: every argument after its name is its own, so one it does not know is an error here."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)} ({self.prog} --help lists its flags)")
        return namespace, extras
