"""What cudask adds to the `dask` command: `dask cudask ...` always, `dask cuda ...` unless
dask-cuda (or any other package) declares `dask cuda` too.

Covers: the objects that cudask's two `dask_cli` entry points (pyproject.toml) load, and
saying which package `dask cuda` runs (`cudask info`). Does not cover: the commands
themselves (cudask.cli.main wires them).

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

from importlib.metadata import EntryPoint, PackageNotFoundError, entry_points, version

import click

#: dask's entry-point group for `dask` subcommands.
GROUP = "dask_cli"
#: The name of the hidden command the `cuda` entry point loads to while another package owns
#: `dask cuda` (a name no other package uses, so dask has nothing to overwrite).
STANDING_ASIDE = "cudask-leaves-cuda-to-dask-cuda"


def _is_cudask(ep: EntryPoint) -> bool:
    return ep.value.split(":", 1)[0].split(".", 1)[0].strip() == "cudask"


def other_cuda_entry_points() -> list[EntryPoint]:
    """Every `dask_cli` entry point named `cuda` that is not cudask's (dask-cuda's, normally)."""
    return [ep for ep in entry_points(group=GROUP) if ep.name == "cuda" and not _is_cudask(ep)]


def _label(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return ep.value.split(":", 1)[0].split(".", 1)[0]
    return f"{dist.name} {dist.version}"


def _cudask_label() -> str:
    try:
        return f"cudask {version('cudask')}"
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "cudask"


def dask_cuda_runs() -> str | None:
    """Which installed package `dask cuda ...` runs, as "name version"; None when none gives it.

    Several other packages (not only dask-cuda) would make it a matter of chance among them;
    they are then listed with " or "."""
    others = other_cuda_entry_points()
    if others:
        return " or ".join(dict.fromkeys(_label(ep) for ep in others))
    if any(ep.name == "cuda" and _is_cudask(ep) for ep in entry_points(group=GROUP)):
        return _cudask_label()
    return None


def which_line() -> str:
    """One sentence for people: who runs `dask cuda`, and how to get cudask either way."""
    runs = dask_cuda_runs()
    if runs is None:
        return ("`dask cuda` is not installed (no installed package declares it); "
                "cudask runs as `cudask worker` or `python -m cudask.cli worker`.")
    if runs.startswith("cudask"):
        return (f"`dask cuda ...` runs {runs} (dask-cuda is not installed); "
                "so do `dask cudask ...` and `cudask ...`.")
    return (f"`dask cuda ...` runs {runs}; cudask is `dask cudask ...` or `cudask ...` "
            "(cudask leaves `dask cuda` to dask-cuda while both are installed).")


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
