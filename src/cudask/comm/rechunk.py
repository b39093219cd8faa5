"""Which method dask uses to rechunk arrays in a process that runs a cudask cluster.

Covers: choosing dask's task-based rechunk (``array.rechunk.method: tasks``)
when the user has not chosen one, and saying so once: distributed's P2P
rechunk, which dask picks by itself for large all-to-all rechunks once a
distributed client exists, cannot send CuPy arrays (docs/design/comm.md). With
cudask workers, the task-based rechunk moves device arrays between workers of
one host GPU to GPU (cudask.comm.ipc).

Does not cover: dataframe shuffles (dask-cuDF chooses its own method).

Threading: sets a key of dask's process-wide config; LocalCUDACluster calls it
from the thread that starts the cluster.
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
    logger.info(
        "cudask: array.rechunk.method set to 'tasks' in this process: distributed's P2P "
        "rechunk cannot send CuPy arrays (it reads each shard through memoryview, which "
        "CuPy refuses). Set array.rechunk.method yourself to choose."
    )
    return True
