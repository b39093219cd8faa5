"""The workers of one host map each other's RMM pool slabs when they start, not
on their first transfer.

Covers: `MapAhead`, a worker's side of the exchange. Once the worker has joined
its scheduler, it advertises itself in the scheduler's metadata (under `KEY`:
its address and `cudask.comm.ipc_peers.identity`), reads the others' advertisements
and the workers still there (`ncores`), and sends each advertised worker whose
process it may map (`ipc_peers.accepts`: same host, same pid namespace, another
process) its offer (`ipc.offer`: the handles of its pool's slabs) through the
`cudask_ipc_map_ahead` handler. The peer maps them in a thread of its own and
answers with its offer, which this worker maps in turn. Of two workers, the one
that reads the metadata last sees the other, so every pair of a host is
covered. Workers that did not advertise (no DeviceIPC plugin, a second worker in
one process, `cudask.comm.map-ahead: false`) are never asked, nor are advertisements
whose process has ended (an address a later worker may reuse). Opening a mapping
of a peer's slab takes milliseconds per GB of the slab (docs/design/comm.md):
paid at start, that cost leaves the first exchange between the workers.
`prepare` (cudask.comm.staging.ensure: the staging area) runs when the worker
first meets a peer, before its offer, so the area is offered with the slabs.
Everything here is an optimisation: a peer that does not answer, answers
nothing or cannot be mapped is left to the first transfer, which maps it as
before; the failure is logged at debug level.

Does not cover: what is mapped and for how long (cudask.comm.lifetimes), the
offer itself (cudask.comm.ipc), CuPy's chunks without a pool (leased per message:
cudask.comm.leases). An advertisement stays in the scheduler's metadata after
its worker leaves (distributed has no call to remove one); the list of workers
still there and the check that its process runs filter it out.

Threading: `start`, `stop` and the handler run on the worker's event loop (`start`
must be called there, as distributed sets plugins up); the mappings are opened,
and `prepare` and the offer run, in threads of the loop's default executor. An opening still running when the
worker closes is closed once open (`Mappings.close_all`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from distributed.core import Status

from cudask.comm import ipc, ipc_peers

logger = logging.getLogger("cudask.comm")

HANDLER = "cudask_ipc_map_ahead"
# The scheduler's metadata key under which workers advertise the exchange.
KEY = "cudask-map-ahead"
# Seconds to wait for the worker to join its scheduler before giving up.
JOIN_WITHIN = 300.0
_POLL = 0.05


class MapAhead:
    """One worker's exchange of pool slabs with the other workers of its host."""

    def __init__(self, worker: Any, prepare: Callable[[], object] | None = None) -> None:
        self.worker = worker
        self.prepare = prepare  # run once a peer is met, before this worker's offer
        self.tasks: set[asyncio.Task[Any]] = set()

    def start(self) -> None:
        """Answer peers' offers; introduce this worker once it has joined. Call it
        on the worker's event loop."""
        asyncio.get_running_loop()  # raises here, before anything is registered
        self.worker.handlers[HANDLER] = self.answer
        self._spawn(self._introduce())

    def stop(self) -> None:
        """Answer no more offers (a peer that still lists this worker gets None) and
        cancel what is under way."""
        if self.worker.handlers.get(HANDLER) == self.answer:
            self.worker.handlers[HANDLER] = _declined
        for task in self.tasks:
            task.cancel()

    async def answer(
        self, peer: dict[str, Any] | None = None, offer: dict[str, Any] | None = None, **_: Any
    ) -> dict[str, Any] | None:
        """The handler: map the offer of `peer` (an `ipc_peers.identity`) in the
        background and return ours, if this process may exchange with it."""
        if not ipc_peers.accepts(peer):
            return None
        if offer is not None:
            self._spawn(self._map(offer, "its offer"))
        return await _own_offer(self.prepare)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(_ended)
        task.add_done_callback(self.tasks.discard)

    async def _introduce(self) -> None:
        """Once joined: offer ours to each worker of this host, map what each answers."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + JOIN_WITHIN
        while self.worker.status not in (Status.running, Status.paused):
            if (
                self.worker.status in (Status.closing, Status.closed, Status.failed)
                or loop.time() > deadline
            ):
                return
            await asyncio.sleep(_POLL)
        peers = await self._peers()
        if not peers:
            return
        me, mine = ipc_peers.identity(), await _own_offer(self.prepare)
        for peer in peers:
            try:
                theirs = await self.worker.rpc(peer).cudask_ipc_map_ahead(peer=me, offer=mine)
            except Exception:  # gone, or an older cudask
                logger.debug("cudask: %s did not exchange pool slabs", peer, exc_info=True)
                continue
            await self._map(theirs, peer)

    async def _peers(self) -> list[str]:
        """Advertise this worker; the advertised workers still there whose process
        this one may map (empty when the scheduler does not answer)."""
        me = self.worker.address
        scheduler = self.worker.scheduler
        try:
            await scheduler.set_metadata(keys=[KEY, me], value=ipc_peers.identity())
            advertised = await scheduler.get_metadata(keys=[KEY], default={})
            workers = await scheduler.ncores()
            return [
                address
                for address, identity in advertised.items()
                if address != me and address in workers and ipc_peers.accepts(identity)
            ]
        except Exception:  # an optimisation: the first transfer maps instead
            logger.debug("cudask: no list of workers to map pool slabs ahead", exc_info=True)
            return []

    async def _map(self, offer: dict[str, Any] | None, source: str) -> None:
        try:
            mapped = await asyncio.to_thread(ipc.map_ahead, offer)
        except Exception:  # the first transfer maps it (or explains why not)
            logger.debug("cudask: mapping the pool slabs of %s ahead failed", source, exc_info=True)
            return
        if mapped:
            logger.debug("cudask: mapped %d pool slab(s) of %s ahead", mapped, source)


async def _declined(**_: Any) -> None:
    """The handler of a worker whose exchange has stopped: no offer."""


def _ended(task: asyncio.Task[Any]) -> None:
    """Log at debug level what a background step raised (none should)."""
    if not task.cancelled() and task.exception() is not None:
        logger.debug("cudask: mapping pool slabs ahead failed", exc_info=task.exception())


async def _own_offer(prepare: Callable[[], object] | None = None) -> dict[str, Any] | None:
    """This worker's offer (`ipc.offer`, in a thread: it exports handles), after
    `prepare`; None when that fails (logged at debug level: peers map its slabs on
    their first message)."""

    def offer() -> dict[str, Any] | None:
        if prepare is not None:
            prepare()
        return ipc.offer()

    try:
        return await asyncio.to_thread(offer)
    except Exception:
        logger.debug("cudask: could not offer this worker's pool slabs", exc_info=True)
        return None


__all__ = ["HANDLER", "JOIN_WITHIN", "KEY", "MapAhead"]
