"""The distributed.Worker that cudask starts when device IPC is on.

Covers: answering another worker's request for data (`get_data`) by CUDA IPC
first when the request says the requester accepts it, keeping what was exported
alive (`cudask.comm.ipc.keep_alive`) until the requester has answered. A cudask worker lists the
``cudask-ipc`` family *last* among the serializers its requests carry, so a
worker without cudask, answering it, serializes with "dask" or "pickle" as
usual and never looks that name up (it would fail on a name it does not know);
this class moves the family to the front of what a cudask requester accepts.
A worker that cannot map a peer's memory (`MappingRefused`: e.g. containers
with separate IPC namespaces) stops asking for the family, drops its
connections to that peer (which still waits for an answer on one) and fetches
the keys again, through host memory (`gather_dep`, the state machine's
extension point). Alias tasks of spilled keys are linked in the store
(cudask.memory.aliases, which this class derives from); everything else is
distributed.Worker's.

Does not cover: the family itself (cudask.comm.ipc) and choosing this class
(cudask.worker.spec; a user's own worker_class is used as given, without IPC
unless it derives from this one).

Threading: `get_data` and `gather_dep` run on the worker's event loop, as
distributed's do.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Collection
from typing import Any

from distributed.worker_state_machine import (
    GatherDepFailureEvent,
    GatherDepNetworkFailureEvent,
    StateMachineEvent,
)

from cudask.comm.ipc import FAMILY, keep_alive
from cudask.comm.ipc_cuda import MappingRefused
from cudask.memory import aliases

logger = logging.getLogger("cudask.comm")


class Worker(aliases.Worker):
    """cudask's worker (cudask.memory.aliases) whose replies to get_data try CUDA IPC
    first when the requester accepts it."""

    async def get_data(self, comm: Any, keys: Collection[str], who: str | None = None,
                       serializers: list[str] | None = None) -> Any:
        if not serializers or FAMILY not in serializers:
            return await super().get_data(comm, keys, who=who, serializers=serializers)
        serializers = [FAMILY, *(s for s in serializers if s != FAMILY)]
        with keep_alive():  # get_data returns once the requester has answered "OK"
            return await super().get_data(comm, keys, who=who, serializers=serializers)

    async def gather_dep(self, worker: str, to_gather: Collection[Any], total_nbytes: int, *,
                         stimulus_id: str) -> StateMachineEvent:
        event = await super().gather_dep(worker, to_gather, total_nbytes, stimulus_id=stimulus_id)
        refused = _refusal(event)
        if refused is None:
            return event
        if self._stop_asking_for_ipc():
            logger.warning("%s. This worker receives device data through host memory from now on.",
                           refused)
        self.rpc.remove(worker)  # the peer waits for "OK" on the connection the reply came by
        # as a network failure: the keys are fetched again, now through host memory
        return GatherDepNetworkFailureEvent(worker=worker, total_nbytes=total_nbytes,
                                            stimulus_id=stimulus_id)

    def _stop_asking_for_ipc(self) -> bool:
        """Take the family out of what this worker's requests accept; whether it was in."""
        accepted = self.rpc.deserializers
        if not accepted or FAMILY not in accepted:
            return False
        self.rpc.deserializers = [s for s in accepted if s != FAMILY]
        return True


def _refusal(event: StateMachineEvent) -> MappingRefused | None:
    """The refused mapping that failed a fetch, if that is what failed it (the event
    carries the exception pickled, as distributed sends errors)."""
    if not isinstance(event, GatherDepFailureEvent):
        return None
    try:
        err = pickle.loads(event.exception.data)
    except Exception:  # noqa: BLE001 - not ours to explain
        return None
    return err if isinstance(err, MappingRefused) else None
