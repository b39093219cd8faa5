"""`cudask alias install|remove|status`: let code that imports dask_cuda run on cudask.

Covers: the three commands over cudask.dask_cuda_alias, each answering in one line; a refusal
(a real dask-cuda installed, another package in the way) exits with status 2. Does not
cover: what the alias serves (cudask.dask_cuda_alias). Threading: the command's thread.
"""

from __future__ import annotations

from pathlib import Path

import click

TARGET = click.option(
    "--target",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder on the import path (default: this interpreter's site-packages).",
)


@click.group("alias", context_settings={"help_option_names": ["-h", "--help"]})
def alias() -> None:
    """`import dask_cuda` served by cudask, where dask-cuda is not installed."""


@alias.command("install")
@TARGET
def install(target: Path | None) -> None:
    """Write the dask_cuda alias package (refused beside a real dask-cuda)."""
    from cudask import dask_cuda_alias as cudask_alias

    try:
        package = cudask_alias.install(target)
    except cudask_alias.AliasError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(f"import dask_cuda now gets cudask ({package})")


@alias.command("remove")
@TARGET
def remove(target: Path | None) -> None:
    """Delete the dask_cuda alias package."""
    from cudask import dask_cuda_alias as cudask_alias

    try:
        package = cudask_alias.remove(target)
    except cudask_alias.AliasError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(f"removed {package}" if package else "no alias to remove")


@alias.command("status")
def status() -> None:
    """Say where `import dask_cuda` leads."""
    from cudask import dask_cuda_alias as cudask_alias

    click.echo(cudask_alias.status())
