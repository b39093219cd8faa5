"""GPUWorker: the distributed.Worker every cudask worker process runs.

Covers: two behaviours over distributed's Worker. Links: an alias task (dask's
`Alias`, one per partition at the head of every dask-expr graph over a persisted
collection) whose key is a device object the store has spilled is not run (running
it would bring the data back only for the next alias to push it out): it is reported
done at once, with the key's size and type, and `Linked(key)` is stored, which makes
the task's key a second name of the key's entry (cudask.memory.tiers.names). Device
IPC: a request that accepts the cudask-ipc family is answered by CUDA IPC first
(cudask.comm.ipc), the exported memory kept alive until the requester has answered;
a worker whose peer's memory cannot be mapped stops asking for the family and fetches
again through host memory. Both are inert where they do not apply (another store, IPC
off). Does not cover: choosing the class (cudask.worker.spec).

Threading: the worker's event loop, as distributed's; the spilled-key check reads the
store without its lock (a stale answer links a key back on the device: as right).
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Collection
from time import time
from typing import Any

import distributed
from dask._task_spec import Alias
from dask.typing import Key
from distributed.core import Status
from distributed.worker_state_machine import (
    ExecuteSuccessEvent,
    GatherDepFailureEvent,
    GatherDepNetworkFailureEvent,
    StateMachineEvent,
)

from cudask.comm.ipc import FAMILY, keep_alive
from cudask.comm.ipc_cuda import MappingRefused
from cudask.memory.store import TieredStore
from cudask.memory.tiers.names import Linked

logger = logging.getLogger("cudask.worker")

#: The worker states in which distributed's `execute` runs a task.
_RUNNING = (Status.running, Status.paused, Status.closing_gracefully)


class GPUWorker(distributed.Worker):
    """distributed.Worker that links alias tasks of spilled device keys in its store
    and answers other workers by CUDA IPC where they accept it."""

    # -- links
    async def execute(self, key: Key, *, stimulus_id: str) -> StateMachineEvent:
        linked = self._linked(key)
        if linked is not None:
            return linked
        return await super().execute(key, stimulus_id=stimulus_id)

    def _linked(self, key: Key) -> ExecuteSuccessEvent | None:
        """The event of an alias task done by linking its key, or None: run it."""
        ts = self.state.tasks.get(key)
        if (
            ts is None
            or ts.state != "executing"
            or self.status not in _RUNNING
            or not isinstance(ts.run_spec, Alias)
        ):
            return None
        source = self.state.tasks.get(ts.run_spec.target)
        store = self.data
        if (
            source is None
            or source.state != "memory"
            or source.nbytes is None
            or not isinstance(store, TieredStore)
            or not store.is_spilled_device_object(source.key)
        ):
            return None
        now = time()
        return ExecuteSuccessEvent(
            key=key,
            run_id=ts.run_id,
            value=Linked(source.key),
            start=now,
            stop=now,
            nbytes=source.nbytes,
            type=source.type,
            stimulus_id=f"cudask-alias-{now}",
        )

    # -- device IPC
    async def get_data(
        self,
        comm: Any,
        keys: Collection[str],
        who: str | None = None,
        serializers: list[str] | None = None,
    ) -> Any:
        if not serializers or FAMILY not in serializers:
            return await super().get_data(comm, keys, who=who, serializers=serializers)
        serializers = [FAMILY, *(s for s in serializers if s != FAMILY)]
        with keep_alive():  # get_data returns once the requester has answered "OK"
            return await super().get_data(comm, keys, who=who, serializers=serializers)

    async def gather_dep(
        self, worker: str, to_gather: Collection[Any], total_nbytes: int, *, stimulus_id: str
    ) -> StateMachineEvent:
        event = await super().gather_dep(worker, to_gather, total_nbytes, stimulus_id=stimulus_id)
        refused = _refusal(event)
        if refused is None:
            return event
        if self._stop_asking_for_ipc():
            logger.warning(
                "%s. This worker receives device data through host memory from now on.", refused
            )
        self.rpc.remove(worker)  # the peer waits for "OK" on the connection the reply came by
        # as a network failure: the keys are fetched again, now through host memory
        return GatherDepNetworkFailureEvent(
            worker=worker, total_nbytes=total_nbytes, stimulus_id=stimulus_id
        )

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


__all__ = ["GPUWorker"]
