"""Who runs `dask cuda`: cudask, or another package (dask-cuda) that declares it too.

Covers: reading the `dask_cli` entry points of every installed distribution, naming the
package `dask cuda ...` runs (`cudask info` prints it), and the one sentence that says how
to reach cudask either way. Does not cover: the entry-point objects dask loads
(cudask.cli.dask_cli), nor the commands. Reads package metadata only, imports no command:
safe to call from any thread, each call reads the metadata afresh.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, PackageNotFoundError, entry_points, version

#: dask's entry-point group for `dask` subcommands.
GROUP = "dask_cli"


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
        return (
            "`dask cuda` is not installed (no installed package declares it); "
            "cudask runs as `cudask worker` or `python -m cudask.cli worker`."
        )
    if runs.startswith("cudask"):
        return (
            f"`dask cuda ...` runs {runs} (dask-cuda is not installed); "
            "so do `dask cudask ...` and `cudask ...`."
        )
    return (
        f"`dask cuda ...` runs {runs}; cudask is `dask cudask ...` or `cudask ...` "
        "(cudask leaves `dask cuda` to dask-cuda while both are installed)."
    )
