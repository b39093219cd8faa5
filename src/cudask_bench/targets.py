"""Where each backend's runner runs, checked before any benchmark process starts.

Covers: `Target`, an interpreter (and PYTHONPATH additions) that runs a backend's runner:
this interpreter for cudask and the dict baseline; this or another interpreter, or this
one with an extra PYTHONPATH directory, for dask-cuda. Another interpreter gets cudask
and cudask_bench alone on its path through a shim directory of links (`make_shim`).
`resolve_dask_cuda` probes the dask-cuda environment with a stdlib-only snippet and
`check_local` this one; both end in one line naming what is missing. Does not cover:
spawning runners (cudask_bench.harness). Threading: used by the command's thread only.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cudask.errors import MissingDependencyError, OptionError
from cudask_bench import environment

CUPY_INSTALL = "pip install cupy-cuda13x (or: pip install 'cudask[cuda]')"


@dataclasses.dataclass(frozen=True)
class Target:
    """An interpreter (and PYTHONPATH additions) that runs a backend's runner."""

    python: str
    pythonpath: tuple[str, ...] = ()
    probe: Mapping[str, Any] | None = None

    def env(self, shim: str | None) -> dict[str, str]:
        env = dict(os.environ)
        parts = [p for p in (*self.pythonpath, shim) if p]
        if parts:
            existing = env.get("PYTHONPATH")
            env["PYTHONPATH"] = os.pathsep.join(parts + ([existing] if existing else []))
        env["PYTHONUNBUFFERED"] = "1"
        return env

    @property
    def foreign(self) -> bool:
        """Whether cudask must be put on this interpreter's path (it is not ours)."""
        return os.path.realpath(self.python) != os.path.realpath(sys.executable)


#: The packages another interpreter gets on its path: the runner, the task functions
#: and the bench workers' counters live in cudask_bench and use cudask.
SHIM_PACKAGES: tuple[str, ...] = ("cudask", "cudask_bench")


def package_root(name: str = "cudask") -> Path:
    """The directory of package `name` (one of SHIM_PACKAGES) as this interpreter has it."""
    module = importlib.import_module(name)
    return Path(str(module.__file__)).resolve().parent


def make_shim() -> str:
    """A temp directory holding only links to SHIM_PACKAGES, for another interpreter's
    PYTHONPATH.

    Putting the directory that contains cudask on PYTHONPATH could expose other
    packages installed next to it (site-packages) to a different Python; the
    links expose cudask and cudask_bench alone.
    """
    shim = tempfile.mkdtemp(prefix="cudask-bench-path-")
    for name in SHIM_PACKAGES:
        os.symlink(package_root(name), os.path.join(shim, name))
    return shim


def remove_shim(shim: str) -> None:
    """Remove a directory made by `make_shim` (what is already gone is let be)."""
    try:
        for name in SHIM_PACKAGES:
            os.unlink(os.path.join(shim, name))
        os.rmdir(shim)
    except OSError:
        pass


def check_dask_cuda_paths(python: str | None, path: str | None) -> Target:
    """Check --dask-cuda-python / --dask-cuda-path exist (no process started)."""
    if python is not None:
        resolved = python if os.sep in python else _which(python)
        if resolved is None or not os.path.exists(resolved):
            raise OptionError(
                f"--dask-cuda-python={python!r} does not exist; give the path of a Python "
                "interpreter where dask-cuda is installed, e.g. --dask-cuda-python "
                "/opt/dask-cuda-26.10/bin/python"
            )
        if os.path.isdir(resolved) or not os.access(resolved, os.X_OK):
            raise OptionError(
                f"--dask-cuda-python={python!r} is not an executable file; give the path of "
                "a Python interpreter, e.g. /opt/dask-cuda-26.10/bin/python"
            )
        python = resolved
    extra: tuple[str, ...] = ()
    if path is not None:
        if not os.path.isdir(path):
            raise OptionError(
                f"--dask-cuda-path={path!r} is not a directory; give a directory where "
                "dask-cuda is installed (pip install --target DIR dask-cuda-cu13)"
            )
        extra = (os.path.abspath(path),)
    return Target(python or sys.executable, extra)


def resolve_dask_cuda(
    python: str | None, path: str | None, *, jit_unspill: bool, array_module: str
) -> Target:
    """Check the dask-cuda environment before any benchmark starts; raise a one-line error.

    Runs a stdlib-only probe in that interpreter (it imports neither dask-cuda
    nor CuPy) to learn what is installed there and which dask-cuda version.
    """
    target = check_dask_cuda_paths(python, path)
    extra = target.pythonpath
    try:
        facts = environment.probe_python(target.python, target.env(None))
    except RuntimeError as exc:
        raise OptionError(f"--dask-cuda-python: {exc}") from None
    where = f"{target.python}" + (f" with PYTHONPATH {extra[0]}" if extra else "")
    found = facts.get("found", {})
    if not found.get("dask_cuda"):
        hint = (
            "give --dask-cuda-python PATH (a Python where dask-cuda is installed) or "
            "--dask-cuda-path DIR"
            if python is None and path is None
            else "install dask-cuda there"
        )
        raise MissingDependencyError("dask-cuda", f"--against dask-cuda (in {where})", hint)
    for module in ("dask", "distributed"):
        if not found.get(module, True):
            raise MissingDependencyError(
                module, f"--against dask-cuda (in {where})", f"pip install {module}"
            )
    if array_module == "cupy" and not found.get("cupy"):
        raise MissingDependencyError("cupy", f"--against dask-cuda (in {where})", CUPY_INSTALL)
    version = facts.get("versions", {}).get("dask_cuda")
    if jit_unspill and not environment.dask_cuda_has_jit_unspill(
        version, facts.get("dask_cuda_has_proxy_object")
    ):
        raise OptionError(
            f"--jit-unspill against dask-cuda {version} (in {where}): dask-cuda removed "
            "JIT-unspill in 26.06; point --dask-cuda-python at an environment with "
            "dask-cuda 26.04, or use --jit-unspill off (or --against-jit-unspill off)"
        )
    return dataclasses.replace(target, probe=facts)


def _which(name: str) -> str | None:
    import shutil

    return shutil.which(name)


def check_local(backends: Sequence[str], array_module: str) -> None:
    """Check this interpreter can run the local backends; raise a one-line error."""
    if (
        array_module == "cupy"
        and {"cudask", "dict"} & set(backends)
        and not environment.has_module("cupy")
    ):
        raise MissingDependencyError("cupy", "cudask bench (--array-module cupy)", CUPY_INSTALL)


__all__ = [
    "CUPY_INSTALL",
    "SHIM_PACKAGES",
    "Target",
    "check_dask_cuda_paths",
    "check_local",
    "make_shim",
    "package_root",
    "remove_shim",
    "resolve_dask_cuda",
]
