"""Subcommands loaded by name only when they run: how `cudask bench` stays out of `cudask`.

Covers: `LazyCommand`, a subcommand declared by name, import target ("module:attribute")
and the one-line summary shown in the group's listing; `LazyGroup`, a click group (that
also reports user errors on one line, like UserErrorGroup) that lists lazy subcommands
beside its own and imports one only when click resolves it for running, its `--help`
included. Listing the group (`cudask --help`) imports nothing. Does not cover: what the
loaded commands do. Threading: click builds and runs commands in one thread; a loaded
command is cached in the group.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import click

from cudask.cli.user_errors import UserErrorGroup


@dataclass(frozen=True)
class LazyCommand:
    """A subcommand that lives in another package, attached by name."""

    name: str
    target: str  # "package.module:attribute", a click.Command
    summary: str  # the first paragraph of the command's help, for the group's listing

    def load(self) -> click.Command:
        module, _, attribute = self.target.partition(":")
        command = getattr(importlib.import_module(module), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{self.target} is not a click command")
        return command


class _Listed(click.Command):
    """What the group's listing shows of a lazy subcommand before it is loaded."""

    def __init__(self, lazy: LazyCommand) -> None:
        super().__init__(lazy.name, help=lazy.summary)
        self.lazy = lazy


class LazyGroup(UserErrorGroup):
    """A click group with subcommands imported only when one of them runs."""

    def __init__(self, *args: Any, lazy: Iterable[LazyCommand] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = {command.name: command for command in lazy}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name in self.lazy:
            return _Listed(self.lazy[cmd_name])
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if isinstance(command, _Listed):
            lazy = command.lazy
            command = lazy.load()
            self.add_command(command, lazy.name)
        return name, command, rest


__all__ = ["LazyCommand", "LazyGroup"]
