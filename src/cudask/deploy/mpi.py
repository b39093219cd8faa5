"""MPI ranks: which GPU the worker of an MPI rank takes (dask-mpi).

Covers: telling whether this process is a rank of an MPI job (mpi4py imported
and MPI initialized, as dask-mpi's `dask-mpi` command and `initialize()` do),
reading the rank's local rank and the ranks on its node from the launcher's
environment (Open MPI, MVAPICH2, MPICH/Intel MPI's Hydra, Cray PMI, srun), and
the rule CUDAWorker follows there:

- several ranks on a node with several GPUs visible: local rank r takes the
  r-th visible GPU (r mod the number of GPUs; dask-mpi's scheduler and client
  ranks start no worker, so up to two more ranks than GPUs may share a node);
- more ranks than that on one node: an error naming both numbers;
- one GPU named in CUDA_VISIBLE_DEVICES, one rank on the node, or a job of one
  rank: every visible GPU, as outside MPI;
- a user error (bad option, too many ranks): `Error: <message>` on one line and
  MPI_Abort, so the job ends instead of waiting for ranks that never finish;
- no nanny unless `nanny=True`: the rank is its worker. Why these rules:
  docs/design/mpi.md.

Processes that have not initialized MPI are left alone. Does not cover:
starting workers (cudask.deploy.node), nor dask-jobqueue's SLURMRunner, which
does not initialize MPI.

Threading: reads the environment it is given; call it from any thread.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cudask.devices import Device
from cudask.errors import DeviceError, OptionError

logger = logging.getLogger("cudask.mpi")

# (local rank, ranks on this node) as each launcher names them, most specific first:
# an MPI started by srun sees both its own variables and SLURM's.
LAUNCHER_VARIABLES: tuple[tuple[str, str], ...] = (
    ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),  # Open MPI
    ("MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"),  # MVAPICH2
    ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),  # MPICH and Intel MPI (Hydra)
    ("PMI_LOCAL_RANK", "PMI_LOCAL_SIZE"),  # Cray PMI / PALS
    ("SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE"),  # srun
)

SPARE_RANKS = 2
"""Ranks of a node that may go without a GPU of their own: dask-mpi's scheduler
(global rank 0) and client (global rank 1, `initialize()`), which start no worker."""


@dataclass(frozen=True)
class LocalRank:
    """This rank's place on its node: `rank` among `size` ranks (None: unknown),
    read from the environment variable `source`."""

    rank: int
    size: int | None
    source: str


def mpi_world_size() -> int | None:
    """Ranks of the MPI job this process belongs to; None when it has not
    initialized MPI through mpi4py (importing cudask never imports mpi4py)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None:
        return None
    try:
        if not mpi.Is_initialized() or mpi.Is_finalized():
            return None
        return int(mpi.COMM_WORLD.Get_size())
    except (RuntimeError, AttributeError):  # MPI.Exception: an MPI that cannot answer
        return None


def _whole(name: str, value: str) -> int:
    text = value.strip()
    if not text.isdigit():
        raise OptionError(
            f"{name}={value!r} is not a whole number; the MPI launcher sets it to "
            "this rank's place on its node, e.g. 0"
        )
    return int(text)


def _slurm_tasks_per_node(value: str) -> int | None:
    """SLURM_STEP_TASKS_PER_NODE ("4", "4(x2)", "4(x2),3"): the count when every
    node runs the same number of tasks, else None (this node's is not known)."""
    counts = set()
    for part in value.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:\(x\d+\))?\s*", part)
        if m is None:
            return None
        counts.add(int(m.group(1)))
    return counts.pop() if len(counts) == 1 else None


def local_rank(environ: Mapping[str, str]) -> LocalRank | None:
    """This rank's local rank and the ranks on its node, from the first launcher
    whose variable is set; None when none is."""
    for rank_var, size_var in LAUNCHER_VARIABLES:
        if rank_var not in environ:
            continue
        rank = _whole(rank_var, environ[rank_var])
        raw = environ.get(size_var)
        if raw is None:
            size = None
        elif size_var == "SLURM_STEP_TASKS_PER_NODE":
            size = _slurm_tasks_per_node(raw)
        else:
            size = _whole(size_var, raw)
        if size is not None and rank >= size:
            raise OptionError(
                f"{rank_var}={rank} is not below {size_var}={size}; the MPI "
                "launcher's variables disagree"
            )
        return LocalRank(rank, size, rank_var)
    return None


def _labels(devices: Sequence[Device]) -> str:
    return ", ".join(d.label for d in devices)


def rank_device(devices: Sequence[Device], where: LocalRank) -> int:
    """Index in `devices` (the visible GPUs, two or more) of the GPU the worker of
    this rank takes: local rank r takes GPU r mod len(devices), and a node may run
    at most SPARE_RANKS ranks more than it has GPUs."""
    n = len(devices)
    most = n + SPARE_RANKS
    if where.size is not None and where.size > most:
        raise DeviceError(
            f"{where.size} MPI ranks run on this node but it has {n} GPUs visible "
            f"({_labels(devices)}): one worker rank per GPU, plus dask-mpi's scheduler and "
            f"client ranks, makes at most {most}. Start at most {n} worker ranks per node "
            f"(e.g. mpirun --map-by ppr:{n}:node, srun --ntasks-per-node={n})"
        )
    if where.rank >= most:
        raise DeviceError(
            f"MPI local rank {where.rank} has no GPU: this node has {n} GPUs visible "
            f"({_labels(devices)}), so local ranks 0..{n - 1} take one each and ranks "
            f"{n}..{most - 1} the GPUs of dask-mpi's scheduler and client ranks. Start at most "
            f"{n} worker ranks per node (e.g. mpirun --map-by ppr:{n}:node)"
        )
    index = where.rank % n
    if where.rank >= n:
        logger.info(
            "MPI local rank %d takes %s, the GPU of local rank %d (dask-mpi's scheduler "
            "or client on the first node: it starts no worker)",
            where.rank,
            devices[index].label,
            index,
        )
    return index


def abort_job(exc: BaseException) -> None:
    """In an MPI job of several ranks, print `Error: <message>` (one line, as the CLI
    does) and end the whole job with MPI_Abort. A rank that raised would otherwise wait
    in MPI_Finalize for ranks that never finish (dask-mpi's scheduler), and the job
    would hang until its walltime. Outside such a job, do nothing."""
    world = mpi_world_size()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or world is None or world < 2:
        return
    rank = mpi.COMM_WORLD.Get_rank()
    print(f"Error: {exc} (MPI rank {rank}: ending the MPI job)", file=sys.stderr, flush=True)
    mpi.COMM_WORLD.Abort(1)


@dataclass(frozen=True)
class MPIRank:
    """This process as a rank of an MPI job of `world_size` ranks; `local` is its
    place on its node (None: no launcher variable says)."""

    world_size: int
    local: LocalRank | None


def check_rank(environ: Mapping[str, str]) -> MPIRank | None:
    """This process's MPI rank when it is one of several (the launcher's variables
    are checked here, before any GPU is looked for); None outside MPI or in a job
    of one rank."""
    world = mpi_world_size()
    if world is None or world < 2:
        return None
    return MPIRank(world, local_rank(environ))


def devices_for_rank(
    devices: Sequence[Device], rank: MPIRank | None, *, narrowed: bool
) -> list[int]:
    """Indices in `devices` (the visible GPUs) that this process starts workers on.

    `rank` is check_rank()'s answer; `narrowed` says CUDA_VISIBLE_DEVICES is set.
    Outside MPI, with one rank on the node, or with the one GPU the launcher named
    for this rank: every visible GPU. Several GPUs visible to one of several ranks:
    the GPU of its local rank (rank_device). No local rank to go by: an error."""
    every = list(range(len(devices)))
    if rank is None or (len(devices) == 1 and narrowed):
        return every  # not MPI, or the launcher (a wrapper script) gave this rank its GPU
    where = rank.local
    if where is None:
        names = ", ".join(var for var, _ in LAUNCHER_VARIABLES)
        raise DeviceError(
            f"this MPI rank sees {len(devices)} GPUs ({_labels(devices)}) but none of {names} "
            "tells its local rank; set CUDA_VISIBLE_DEVICES to one GPU per rank in the launch "
            "command (e.g. from your launcher's local rank variable)"
        )
    if where.size == 1:
        return every  # the only rank on its node: every GPU, one worker each
    return [rank_device(devices, where)]


__all__ = [
    "LAUNCHER_VARIABLES",
    "SPARE_RANKS",
    "LocalRank",
    "MPIRank",
    "abort_job",
    "check_rank",
    "devices_for_rank",
    "local_rank",
    "mpi_world_size",
    "rank_device",
]
