"""How a cudask worker closes: its store first, within its nanny's close timeout.

Covers: `CloseStore` (the `cudask-close-store` plugin), whose teardown closes the
worker's data store, which removes every spilled file and gives the pinned host
memory back while the worker still runs; and `Nanny`, a distributed.Nanny whose
`close()` waits `close_timeout` seconds (the `close_timeout` option) where
distributed's waits 5 unless told: the worker has 0.8 of it to end on its own,
then is killed and has as long again to end. A worker holding tens of GB takes
seconds to close so, longer than distributed's 4 s before the kill; a kill midway
leaves files behind. A caller naming a timeout (`close(timeout=...)`) gets it.

Does not cover: choosing these (cudask.worker.spec), the store's close itself
(cudask.memory.store).

Threading: both run on the worker's or the nanny's event loop. The store's close
runs in a thread (the store is thread-safe) so that the loop answers its nanny and
finishes an exchange with the scheduler meanwhile; when the worker is closing, its
heartbeat is stopped first, so that none is in flight when the worker's close shuts
its connections (distributed logs such a one as an ERROR).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Literal

import distributed
from distributed import WorkerPlugin
from distributed.core import Status

logger = logging.getLogger("cudask.worker")

#: distributed.Nanny.close's own timeout, for a Nanny made without close_timeout.
DISTRIBUTED_CLOSE_TIMEOUT = 5.0


class CloseStore(WorkerPlugin):
    """Close the worker's data store at teardown (TieredStore.close, ProxyStore.close),
    while the worker process still runs and its nanny waits, rather than leave it to
    the interpreter's exit or a kill. A store without `closed` and `close` (a dict,
    distributed's SpillBuffer, a store of the user's own) is left as it is. Teardown
    also runs when the plugin is removed, which closes a running worker's store."""

    name = "cudask-close-store"

    def setup(self, worker: Any) -> None:
        return None

    async def teardown(self, worker: Any) -> None:
        store = worker.data
        close = getattr(store, "close", None)
        if getattr(store, "closed", True) or not callable(close):
            return
        if worker.status == Status.closing:
            _stop_heartbeat(worker)
        start = time.perf_counter()
        try:
            await asyncio.to_thread(close)
        except Exception as exc:  # noqa: BLE001 - the worker closes all the same
            logger.warning(
                "cudask: worker %s: closing its data store failed: %s: %s",
                worker.name, type(exc).__name__, exc,
            )  # fmt: skip
            return
        logger.debug(
            "cudask: worker %s closed its data store in %.2f s",
            worker.name, time.perf_counter() - start,
        )  # fmt: skip


def _stop_heartbeat(worker: Any) -> None:
    """Start no more heartbeats of a closing worker (distributed stops them later in its
    close, after the plugins' teardown)."""
    heartbeat = getattr(worker, "periodic_callbacks", {}).get("heartbeat")
    if heartbeat is not None:
        heartbeat.stop()


class Nanny(distributed.Nanny):
    """distributed.Nanny with `close_timeout` as the default timeout of `close()`."""

    def __init__(
        self, *args: Any, close_timeout: float = DISTRIBUTED_CLOSE_TIMEOUT, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.close_timeout = float(close_timeout)

    async def close(  # type: ignore[override]  # distributed.Nanny.close's own signature
        self, timeout: float | None = None, reason: str = "nanny-close"
    ) -> Literal["OK"]:
        return await super().close(
            timeout=self.close_timeout if timeout is None else timeout, reason=reason
        )


__all__ = ["DISTRIBUTED_CLOSE_TIMEOUT", "CloseStore", "Nanny"]
