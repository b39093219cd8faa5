"""How the CLI reports user errors: one line, no traceback, non-zero exit.

Covers: a click Group whose commands turn cudask's user-facing errors into a
click error message. Does not cover: the commands themselves.
"""

from __future__ import annotations

from typing import Any

import click

from cudask.errors import CudaskError


class UserErrorGroup(click.Group):
    """A click group that prints CudaskError as `Error: <message>` and exits 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CudaskError as exc:
            raise click.ClickException(str(exc)) from None
