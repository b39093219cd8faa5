"""What cudask adds to the `dask` command: `dask cudask ...` always, `dask cuda ...` unless
dask-cuda (or any other package) declares `dask cuda` too.

Covers: the objects that cudask's two `dask_cli` entry points (pyproject.toml) load.
Does not cover: the commands themselves (cudask.cli.main wires them), nor finding out which
package `dask cuda` runs (cudask.cli.dask_cuda_owner, which `cudask info` uses too).

Why: dask's CLI (dask.cli.run_cli) loads every `dask_cli` entry point of every installed
distribution and adds the click command each one loads under *that command's* name. When two
packages both give a `cuda` group, the second replaces the first and every `dask` command
prints "the original has been overwritten"; which one is second follows the order in which
importlib.metadata lists distributions (sys.path, then directory order), so which `dask cuda`
runs is left to chance. Entry points are static metadata, but the object an entry point names
is looked up when it is loaded, so cudask decides then:

- ``cudask``: always cudask's commands, as ``dask cudask worker|config|top``.
- ``cuda``: the same commands as ``dask cuda ...`` when no other distribution declares a
  ``cuda`` entry point in ``dask_cli``; otherwise (dask-cuda is installed) a hidden command
  with a name nobody else uses, so that ``dask cuda`` is dask-cuda's, every time, with no
  warning. dask warns for any entry point that does not load to a click command, so
  "nothing" is not an option; the hidden command is the quiet way to step aside.

cudask itself (``cudask worker``, ``python -m cudask.cli worker``) is never affected.
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
        from cudask.cli.main import dask_cudask

        return dask_cudask
    if name == "cuda":
        if other_cuda_entry_points():
            return _stand_aside()
        from cudask.cli.main import cuda

        return cuda
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
