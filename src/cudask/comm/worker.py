"""The distributed.Worker that cudask starts when device IPC is on.

Covers: answering another worker's request for data (`get_data`) by CUDA IPC
first when the request says the requester accepts it, keeping what was exported
alive (`cudask.comm.ipc.keep_alive`) until the requester has answered. A cudask worker lists the
``cudask-ipc`` family *last* among the serializers its requests carry, so a
worker without cudask, answering it, serializes with "dask" or "pickle" as
usual and never looks that name up (it would fail on a name it does not know);
this class moves the family to the front of what a cudask requester accepts.
Everything else is distributed.Worker's.

Does not cover: the family itself (cudask.comm.ipc) and choosing this class
(cudask.worker.spec; a user's own worker_class is used as given, without IPC
unless it derives from this one).

Threading: `get_data` runs on the worker's event loop, as distributed's does.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import distributed

from cudask.comm.ipc import FAMILY, keep_alive


class Worker(distributed.Worker):
    """distributed.Worker whose replies to get_data try CUDA IPC first when the
    requester accepts it."""

    async def get_data(self, comm: Any, keys: Collection[str], who: str | None = None,
                       serializers: list[str] | None = None) -> Any:
        if not serializers or FAMILY not in serializers:
            return await super().get_data(comm, keys, who=who, serializers=serializers)
        serializers = [FAMILY, *(s for s in serializers if s != FAMILY)]
        with keep_alive():  # get_data returns once the requester has answered "OK"
            return await super().get_data(comm, keys, who=who, serializers=serializers)
