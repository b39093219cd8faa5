"""Fixtures of the deploy tests: `mpirun`, a launcher of real MPI jobs that skips
the test where there is no MPI (no mpirun, or no mpi4py for the ranks)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Mpirun:
    """How a test starts an MPI job on this machine."""

    exe: str
    flags: tuple[str, ...]

    def argv(self, n: int) -> list[str]:
        """The start of the command line of an n-rank job."""
        return [self.exe, *self.flags, "-np", str(n)]

    def env(self, **extra: str) -> dict[str, str]:
        """The job's environment: this Python's bin first on PATH (dask-mpi's script),
        Open MPI allowed to run as root (as in containers), no ssh agent."""
        path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
        return {
            **os.environ,
            "PATH": path,
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_plm_rsh_agent": "",
            **extra,
        }


@pytest.fixture
def mpirun() -> Mpirun:
    """An MPI launcher, or a skip. Open MPI gets --oversubscribe (more ranks than
    cores) and --bind-to none (each rank keeps every CPU: the worker pins its threads
    near its GPU itself)."""
    pytest.importorskip("mpi4py", reason="mpi4py is not installed")
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    exe = shutil.which("mpirun", path=path)
    if exe is None:
        pytest.skip("mpirun is not installed")
    version = subprocess.run(
        [exe, "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    open_mpi = "Open MPI" in version.stdout + version.stderr
    flags = ("--allow-run-as-root", "--oversubscribe", "--bind-to", "none") if open_mpi else ()
    return Mpirun(exe, flags)
