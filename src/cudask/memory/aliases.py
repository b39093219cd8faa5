"""Alias tasks over spilled device data: linked in the store, not run.

Covers: `Worker`, the distributed.Worker cudask starts unless the user names another
(cudask.worker.spec; cudask.comm.worker's derives from it). A task whose only work
is to name another key (dask's `Alias`: dask-expr puts one per partition at the head
of every graph over a persisted collection) reads that key and stores the object
under its own. When that key is a device object the worker's TieredStore has moved
to host or disk, the read brings it back to the device only for the next alias's
read to push it out again, before the task that uses it reads it back once more.
This worker does not run such a task: it reports it done at once, with the key's
size, and stores `Linked(key)` under the task's key, which the store makes a second
name of the key's entry (cudask.memory.tiers.names). Nothing moves until a task
reads either key; reads of the task's key return the data. The worker's state
records the type of what it stored, so the scheduler (its dashboard, `Future.type`)
lists such a key as `Linked`. Every other task, and an alias of a key on the device (a
cheap read) or in any other store (JIT-unspill's passes proxies and reads nothing),
runs as distributed runs it.

Does not cover: the store's entries and names (cudask.memory.store,
cudask.memory.tiers.names), answering other workers (cudask.comm.worker).

Threading: `execute` runs on the worker's event loop, as distributed's does. Its
check that the key is spilled reads the store without its lock (a stale answer only
links a key that is back on the device, which is as right); the store takes its lock
to link. The link is written a moment after the check, when distributed's state
machine stores the task's value. A task cancelled meanwhile stores nothing. One
cancelled and asked for again (resumed) after the key left the store meets a
refused write (KeyError): the worker reports that run as erred under its old run id,
which the scheduler takes as stale, releasing the task and running it again
(tests/memory/test_aliases.py). The skipped task records no thread or fine-grained
metrics, only its (empty) compute span.
"""

from __future__ import annotations

from time import time

import distributed
from dask._task_spec import Alias
from dask.typing import Key
from distributed.core import Status
from distributed.worker_state_machine import ExecuteSuccessEvent, StateMachineEvent

from cudask.memory.store import TieredStore
from cudask.memory.tiers.names import Linked

#: The worker states in which distributed's `execute` runs a task.
_RUNNING = (Status.running, Status.paused, Status.closing_gracefully)


class Worker(distributed.Worker):
    """distributed.Worker that links alias tasks of spilled device keys in its store."""

    async def execute(self, key: Key, *, stimulus_id: str) -> StateMachineEvent:
        linked = self._linked(key)
        if linked is not None:
            return linked
        return await super().execute(key, stimulus_id=stimulus_id)

    def _linked(self, key: Key) -> ExecuteSuccessEvent | None:
        """The event of an alias task done by linking its key, or None: run it."""
        ts = self.state.tasks.get(key)
        if ts is None or ts.state != "executing" or self.status not in _RUNNING \
                or not isinstance(ts.run_spec, Alias):
            return None
        source = self.state.tasks.get(ts.run_spec.target)
        store = self.data
        if source is None or source.state != "memory" or source.nbytes is None \
                or not isinstance(store, TieredStore) or not store.is_spilled_device_object(source.key):
            return None
        now = time()
        return ExecuteSuccessEvent(key=key, run_id=ts.run_id, value=Linked(source.key),
                                   start=now, stop=now, nbytes=source.nbytes,
                                   type=source.type, stimulus_id=f"cudask-alias-{now}")


__all__ = ["Worker"]
