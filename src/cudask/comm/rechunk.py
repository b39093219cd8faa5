"""Which method dask uses to rechunk arrays in a process that runs a cudask cluster.

Covers: choosing dask's task-based rechunk when the user has not chosen one.
distributed's P2P rechunk cannot move CuPy arrays: before sending, it measures
every shard with `memoryview`, which CuPy refuses ("Accessing a CuPy ndarray on
CPU is not allowed", distributed 2026.8, CuPy 14), so the job fails in the
transfer phase. dask picks P2P by itself for large all-to-all rechunks once a
distributed client exists, so cudask sets ``array.rechunk.method: tasks`` and
says so once. With cudask workers, the task-based rechunk moves device arrays
between workers of one host GPU to GPU (cudask.comm.ipc).

Does not cover: dataframe shuffles (dask-cuDF chooses its own method).
"""

from __future__ import annotations

import logging

import dask.config

logger = logging.getLogger("cudask")


def prefer_task_rechunk() -> bool:
    """Set ``array.rechunk.method`` to "tasks" in this process unless it is set
    already (by the user, or by an earlier call); return whether it was set now."""
    if dask.config.get("array.rechunk.method", None) is not None:
        return False
    dask.config.set({"array.rechunk.method": "tasks"})
    logger.info("cudask: array.rechunk.method set to 'tasks' in this process: distributed's P2P "
                "rechunk cannot send CuPy arrays (it reads each shard through memoryview, which "
                "CuPy refuses). Set array.rechunk.method yourself to choose.")
    return True
