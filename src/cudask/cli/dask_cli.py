"""What cudask adds to the `dask` command: `dask cudask ...` always, `dask cuda ...` unless
dask-cuda (or any other package) declares `dask cuda` too.

Covers: the objects that cudask's two `dask_cli` entry points (pyproject.toml) load,
decided when dask loads them: ``cudask`` is always cudask's commands (``dask cudask
worker|config|top``); ``cuda`` is the same commands as ``dask cuda ...`` when no other
distribution declares a ``cuda`` entry point, otherwise a hidden command with a name
nobody else uses, so that ``dask cuda`` is dask-cuda's, every time, with no warning
(docs/design/cli.md says why). cudask itself (``cudask worker``, ``python -m cudask.cli
worker``) is never affected.

Does not cover: the commands themselves (cudask.cli.commands wires them), nor finding out
which package `dask cuda` runs (cudask.cli.dask_cuda_owner, which `cudask info` uses too).
Threading: attributes are computed on access, in the caller's thread.
"""

from __future__ import annotations

import click

from cudask.cli.dask_cuda_owner import other_cuda_entry_points, which_line

#: The name of the hidden command the `cuda` entry point loads to while another package owns
#: `dask cuda` (a name no other package uses, so dask has nothing to overwrite).
STANDING_ASIDE = "cudask-leaves-cuda-to-dask-cuda"


def _stand_aside() -> click.Command:
    def callback() -> None:
        click.echo(which_line())

    return click.Command(
        STANDING_ASIDE,
        callback=callback,
        hidden=True,
        help="Say who runs `dask cuda` (cudask leaves it to dask-cuda when both are installed).",
    )


def __getattr__(name: str) -> click.Command:
    """The objects of cudask's `dask_cli` entry points, decided when dask loads them."""
    if name == "cudask":
        from cudask.cli.commands import dask_cudask

        return dask_cudask
    if name == "cuda":
        if other_cuda_entry_points():
            return _stand_aside()
        from cudask.cli.commands import cuda

        return cuda
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
