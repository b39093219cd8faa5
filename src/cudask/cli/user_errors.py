"""How the CLI reports user errors: one line, no traceback, non-zero exit.

Covers: a click Group whose commands turn cudask's user-facing errors into a
click error message; CommandError, a failure printed as `<command>: <message>`;
and ConfigError, a bad value from an environment variable or a config file.
Does not cover: the commands themselves. Threading: raised and printed in the
command's thread.
"""

from __future__ import annotations

from typing import IO, Any

import click

from cudask.errors import CudaskError


class UserErrorGroup(click.Group):
    """A click group that prints CudaskError as `Error: <message>` and exits 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CudaskError as exc:
            raise click.ClickException(str(exc)) from None


class CommandError(click.ClickException):
    """A command that could not do its job for a reason outside its arguments (a
    scheduler that does not answer, an unreadable file): printed on one line as
    `<command>: <message>` (e.g. `cudask top: cannot reach ...`), exit status 1.
    Bad arguments are click.UsageError instead (exit status 2)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        ctx = click.get_current_context(silent=True)
        self.command = ctx.command_path if ctx is not None else "cudask"

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"{self.command}: {self.format_message()}", file=file, err=True)


class ConfigError(click.ClickException):
    """A bad value from an environment variable or a config file (the message names
    which): `Error: <message>` on one line, exit status 2 as for bad flags, but
    without click's usage block, since no flag was misused."""

    exit_code = 2
