"""The workers of one host map each other's RMM pool slabs when they start, not
on their first transfer.

Covers: `MapAhead`, a worker's side of the exchange. Once the worker has joined
its scheduler, it asks the scheduler for the workers (`ncores`), and sends each
one of this host its offer (`cudask.comm.ipc.offer`: the handles of its pool's
slabs) through the `cudask_ipc_map_ahead` handler; the peer maps them in a
thread of its own and answers with its offer, which this worker maps in turn. A
worker that joins later does the same, so every pair of workers of a host is
covered by whichever of the two joined last. Opening a mapping of a peer's slab
takes milliseconds per GB of the slab (docs/design/comm.md): paid at start,
that cost leaves the first exchange between the workers. Everything here
is an optimisation: a peer that does not answer, answers nothing or cannot be
mapped is left to the first transfer, which maps it as before; the failure is
logged at debug level.

Does not cover: what is mapped and for how long (cudask.comm.lifetimes), the
offer itself (cudask.comm.ipc), CuPy's chunks without a pool (leased per message:
cudask.comm.leases).

Threading: `start`, `stop` and the handler run on the worker's event loop; the
mappings are opened in threads of the loop's default executor. An opening still
running when the worker closes is closed once open (`Mappings.close_all`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from distributed.core import Status

from cudask.comm import ipc

logger = logging.getLogger("cudask.comm")

HANDLER = "cudask_ipc_map_ahead"
# Seconds to wait for the worker to join its scheduler before giving up.
JOIN_WITHIN = 300.0
_POLL = 0.05


class MapAhead:
    """One worker's exchange of pool slabs with the other workers of its host."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.tasks: set[asyncio.Task[Any]] = set()

    def start(self) -> None:
        """Answer peers' offers; introduce this worker once it has joined (when
        called on its event loop, as distributed sets plugins up)."""
        self.worker.handlers[HANDLER] = self.answer
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        self._spawn(self._introduce())

    def stop(self) -> None:
        if self.worker.handlers.get(HANDLER) == self.answer:
            del self.worker.handlers[HANDLER]
        for task in self.tasks:
            task.cancel()

    async def answer(self, offer: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """The handler: map the peer's `offer` (in the background) and return ours."""
        self._spawn(self._map(offer, "its offer"))
        return await _own_offer()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _introduce(self) -> None:
        """Once joined: offer ours to each worker of this host, map what each answers."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + JOIN_WITHIN
        while self.worker.status not in (Status.running, Status.paused):
            if self.worker.status in (Status.closing, Status.closed, Status.failed) \
                    or loop.time() > deadline:
                return
            await asyncio.sleep(_POLL)
        try:
            workers = await self.worker.scheduler.ncores()
        except Exception:  # an optimisation: the first transfer maps instead
            logger.debug("cudask: no worker list to map pool slabs ahead", exc_info=True)
            return
        me = self.worker.address
        peers = [a for a in workers if a != me and ipc.same_host({"recipient": {"address": a}})]
        if not peers:
            return
        mine = await _own_offer()
        for peer in peers:
            try:
                theirs = await self.worker.rpc(peer).cudask_ipc_map_ahead(offer=mine)
            except Exception:  # a peer without the handler, or gone
                logger.debug("cudask: %s did not exchange pool slabs", peer, exc_info=True)
                continue
            await self._map(theirs, peer)

    async def _map(self, offer: dict[str, Any] | None, source: str) -> None:
        try:
            mapped = await asyncio.to_thread(ipc.map_ahead, offer)
        except Exception:  # the first transfer maps it (or explains why not)
            logger.debug("cudask: mapping the pool slabs of %s ahead failed", source, exc_info=True)
            return
        if mapped:
            logger.debug("cudask: mapped %d pool slab(s) of %s ahead", mapped, source)


async def _own_offer() -> dict[str, Any] | None:
    """This worker's offer (`ipc.offer`, in a thread: it exports handles); None when
    that fails (logged at debug level: peers map its slabs on their first message)."""
    try:
        return await asyncio.to_thread(ipc.offer)
    except Exception:
        logger.debug("cudask: could not offer this worker's pool slabs", exc_info=True)
        return None


__all__ = ["HANDLER", "JOIN_WITHIN", "MapAhead"]
