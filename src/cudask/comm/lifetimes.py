"""How long device memory shared by CUDA IPC stays mapped in a receiving worker.

Covers: the sender's record of the allocations that live as long as their
process (the slabs an RMM pool takes from CUDA, recorded by the pool's
upstream resource, `Slabs`; a staging area, `lasting`), which the sender marks
"lasting" in what it sends; and the receiver's mappings of other processes'
allocations (`Mappings`): opened on first use, shared by the arrays received
together, closed after the message, except lasting ones, which stay open for
the next messages until their sender's process ends, and leased ones (chunks
of CuPy's pool that the sender keeps allocated for a lease after the message:
cudask.comm.leases), which stay open for a quarter of the lease after their
last use. Lasting allocations may also be mapped before any message names
them (`offered`, `Mappings.map_ahead`).
`sweep`, which the worker runs periodically and on each receive, closes what
has ended; idle mappings past `limit` are closed, and all when the worker
closes. Only lasting and leased
allocations stay mapped, since CUDA leaves undefined what happens when an
exporter frees memory another process maps; a pool one of whose slabs was sent
is held until its process ends (`keep_if_shared`). A sender is known by pid,
start time and pid namespace; mappings of a sender in another pid namespace are
never kept. Costs and reasons: docs/design/comm.md.

Does not cover: the wire format and the copies (cudask.comm.ipc), building the
RMM resource (cudask.worker.rmm).

Threading: thread-safe. One lock guards the sender's record (a pool's
deallocate may run at interpreter exit), one per `Mappings`; a mapping in use
is never closed under its user. `Mappings.map_ahead` opens without the lock
(a pool slab's opening takes up to a second); a `use` of the handle it is
opening waits for it, and nothing else does.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Protocol

logger = logging.getLogger("cudask.comm")

DEFAULT_LIMIT = 64  # idle lasting mappings kept per receiving process
# A leased mapping is kept for this part of the lease after each use, then closed by the
# next sweep (cudask.comm.ipc_settings.MIN_LEASE leaves room for a sweep in the rest).
KEEP_FRACTION = 0.25


class Mapper(Protocol):
    """The two CUDA calls mappings need (cudask.comm.ipc_cuda.Backend has them)."""

    def open(self, handle: bytes) -> int: ...

    def close(self, base: int) -> None: ...


@dataclass(frozen=True)
class Process:
    """A process of this host, told apart from one that reuses its pid later."""

    pid: int
    started: float  # creation time (psutil)
    pidns: int  # inode of its pid namespace; 0 when unknown

    def as_header(self) -> dict[str, Any]:
        return asdict(self)


@functools.cache
def this_process() -> Process:
    return Process(os.getpid(), _started(os.getpid()) or 0.0, _pidns())


def _started(pid: int) -> float | None:
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:
        return -1.0  # alive, start time unreadable


def _pidns() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def alive(process: Process) -> bool:
    """Whether `process` (of this pid namespace) still runs."""
    started = _started(process.pid)
    return started is not None and (started == -1.0 or abs(started - process.started) < 0.05)


def keepable(header: dict[str, Any] | None) -> Process | None:
    """The sender named in a message header, when its lasting mappings may be kept
    here: a process of this pid namespace (its liveness can be checked)."""
    if not header:
        return None
    sender = Process(int(header["pid"]), float(header["started"]), int(header["pidns"]))
    mine = this_process()
    return sender if sender.pidns and sender.pidns == mine.pidns else None


# Sender side: the pools whose slabs are lasting (those of pools a worker gave up are
# not), and the resources held until the process ends.
_pools: list[Slabs] = []
_pools_lock = threading.Lock()
_kept: list[Any] = []
_lasting: set[int] = set()  # allocations held until the process ends (cudask.comm.staging)


class Slabs:
    """The slabs one RMM pool takes from CUDA: `allocate` and `deallocate` are its
    upstream's, for an rmm CallbackMemoryResource under the pool (`upstream`:
    rmm.mr.CudaMemoryResource). A slab is lasting while allocated, until the
    worker gives the pool up (`keep_if_shared`); `shared` says whether one was sent."""

    def __init__(self, upstream: Any) -> None:
        self.upstream = upstream
        self.bases: set[int] = set()
        self.shared = False
        self.lock = _pools_lock  # held here: deallocate may run at interpreter exit
        with self.lock:
            _pools.append(self)

    def allocate(self, nbytes: int, stream: Any) -> int:
        ptr = int(self.upstream.allocate(nbytes, stream))
        with self.lock:
            self.bases.add(ptr)
        return ptr

    def deallocate(self, ptr: int, nbytes: int, stream: Any) -> None:
        with self.lock:
            self.bases.discard(ptr)
        self.upstream.deallocate(ptr, nbytes, stream)


def sending(base: int) -> bool:
    """Whether the allocation at `base`, about to be sent by IPC handle, is lasting
    (a slab of a pool its worker still has); its pool is then noted as shared, to
    be held past the worker (`keep_if_shared`)."""
    with _pools_lock:
        for pool in _pools:
            if base in pool.bases:
                pool.shared = True
                return True
        return base in _lasting


def lasting(base: int) -> None:
    """Record the allocation at `base` as lasting: this process never frees it."""
    with _pools_lock:
        _lasting.add(base)


def offered() -> list[int]:
    """The lasting slabs of this process (and its other lasting allocations: `lasting`),
    offered to the workers of this host to map ahead of any message (cudask.comm.ahead);
    their pools are noted as shared, to be held past the worker (`keep_if_shared`)."""
    with _pools_lock:
        for pool in _pools:
            pool.shared = pool.shared or bool(pool.bases)
        return sorted({base for pool in _pools for base in pool.bases} | _lasting)


def keep_if_shared(slabs: Slabs, resource: Any) -> bool:
    """The worker gives up the pool over `slabs` (its teardown): hold `resource` (the
    pool) until this process ends if one of its slabs was sent, as receivers keep
    those mapped until then and CUDA leaves freeing memory another process maps
    undefined. Either way its slabs are no longer lasting: a send after this (a
    closing worker may still answer) is mapped for that message only."""
    with _pools_lock:
        if slabs in _pools:
            _pools.remove(slabs)
        if slabs.shared:
            _kept.append(resource)
    return slabs.shared


# Receiver side.
@dataclass
class _Mapped:
    base: int
    users: int
    sender: Process | None  # None: closed when its last user ends
    expires: float = math.inf  # kept until then (a leased chunk), or while its sender runs
    freed_from: float = math.inf  # a leased chunk: when its sender may free it, at the earliest


class Mappings:
    """Other processes' allocations mapped in this one, by IPC handle. A handle may
    be opened only once per process, so arrays of one allocation share it."""

    def __init__(
        self, limit: int = DEFAULT_LIMIT, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limit = limit
        self._clock = clock
        self._open: OrderedDict[bytes, _Mapped] = OrderedDict()  # least recently used first
        # Handles `map_ahead` is opening outside the lock; set once they are in `_open` (or failed).
        self._opening: dict[bytes, threading.Event] = {}
        self._closings = 0  # `close_all` calls: an opening that spans one is closed at once
        self._lock = threading.Lock()
        self.counts = {
            "mappings-opened": 0,
            "mappings-opened-ahead": 0,
            "mappings-reused": 0,
            "mappings-closed-late": 0,
        }

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)

    def kept(self) -> int:
        """Lasting mappings open now."""
        with self._lock:
            return sum(1 for m in self._open.values() if m.sender is not None)

    @contextmanager
    def use(
        self, mapper: Mapper, handle: bytes, sender: Process | None, lease: float = 0.0
    ) -> Iterator[int]:
        """The address of the allocation `handle` names, mapped while in use; kept
        afterwards when `sender` is given: while that process runs (a lasting
        allocation), or, with a `lease` (seconds the sender keeps the allocation
        after this message), for a quarter of the lease from now: the sender answered
        after this, and frees it no earlier than a lease after its answer."""
        now = self._clock()
        while (mapped := self._acquire(mapper, handle, sender, lease, now)) is None:
            self._await_opening(handle)
        try:
            yield mapped.base
        finally:
            with self._lock:
                mapped.users -= 1
                if mapped.users == 0 and mapped.sender is None:
                    del self._open[handle]
                    mapper.close(mapped.base)
                elif handle in self._open:
                    self._open.move_to_end(handle)  # used until now: the most recent
                self._trim(mapper)

    def _acquire(
        self, mapper: Mapper, handle: bytes, sender: Process | None, lease: float, now: float
    ) -> _Mapped | None:
        """`use`'s mapping of `handle`, one more user counted; None while `map_ahead`
        opens it."""
        with self._lock:
            if handle in self._opening:
                return None
            mapped = self._open.get(handle)
            if mapped is not None and mapped.users == 0 and mapped.expires <= now:
                self._close(mapper, handle, now)  # its sender may have freed it since: map it anew
                mapped = None
            if mapped is None:
                mapped = self._open[handle] = _Mapped(mapper.open(handle), 0, sender)
                self.counts["mappings-opened"] += 1
            else:
                self._open.move_to_end(handle)
                if mapped.users == 0:
                    self.counts["mappings-reused"] += 1
            if sender is not None:
                mapped.sender = sender
                mapped.expires = now + lease * KEEP_FRACTION if lease else math.inf
                mapped.freed_from = now + lease if lease else math.inf
            mapped.users += 1
            return mapped

    def map_ahead(self, mapper: Mapper, handle: bytes, sender: Process) -> bool:
        """Map a lasting allocation of `sender` before any message names it, kept
        while `sender` runs, as a lasting one `use` kept; False when it is mapped
        already, or when `close_all` ran meanwhile (the new mapping is closed). The
        opening runs outside the lock: only a `use` of this handle waits for it."""
        with self._lock:
            if handle in self._open or handle in self._opening:
                return False
            done = self._opening[handle] = threading.Event()
            closings = self._closings
        try:
            base = mapper.open(handle)
        except BaseException:
            with self._lock:
                del self._opening[handle]
            done.set()
            raise
        with self._lock:
            del self._opening[handle]
            kept = closings == self._closings
            if kept:
                self._open[handle] = _Mapped(base, 0, sender)
                self.counts["mappings-opened-ahead"] += 1
                self._trim(mapper)
            else:
                mapper.close(base)
        done.set()
        return kept

    def _await_opening(self, handle: bytes) -> None:
        """Wait while `map_ahead` opens `handle` (without the lock)."""
        with self._lock:
            done = self._opening.get(handle)
        if done is not None:
            done.wait()

    def _close(self, mapper: Mapper, handle: bytes, now: float) -> None:
        """Unmap `handle` (the lock held), counting a leased one closed after its sender
        may have freed it (the sweep ran that late: said once in the log)."""
        mapped = self._open.pop(handle)
        mapper.close(mapped.base)
        if now >= mapped.freed_from:
            self.counts["mappings-closed-late"] += 1
            if self.counts["mappings-closed-late"] == 1:
                logger.warning(
                    "cudask: a leased IPC mapping was closed %.1f s after its lease "
                    "ended (this worker's sweeps ran late; CUDA leaves mapping freed "
                    "memory undefined): give cudask.comm.device-ipc-lease more time",
                    now - mapped.freed_from,
                )

    def _trim(self, mapper: Mapper) -> None:
        idle = [h for h, m in self._open.items() if m.users == 0]
        for handle in idle[: max(0, len(idle) - self.limit)]:
            mapper.close(self._open.pop(handle).base)

    def sweep(self, mapper: Mapper) -> int:
        """Close the idle mappings whose lease has run out or whose sender has ended;
        how many were closed."""
        now = self._clock()
        with self._lock:
            expired = [h for h, m in self._open.items() if m.users == 0 and m.expires <= now]
            for handle in expired:
                self._close(mapper, handle, now)
            senders = {
                m.sender for m in self._open.values() if m.users == 0 and m.sender is not None
            }
        gone = {s for s in senders if not alive(s)}
        if not gone:
            return len(expired)
        with self._lock:
            ended = [h for h, m in self._open.items() if m.users == 0 and m.sender in gone]
            for handle in ended:
                mapper.close(self._open.pop(handle).base)
        return len(expired) + len(ended)

    def close_all(self, mapper: Mapper) -> None:
        """Close every idle mapping (the worker is closing), and those `map_ahead` is
        opening now once they are open."""
        with self._lock:
            self._closings += 1
            for handle in [h for h, m in self._open.items() if m.users == 0]:
                mapper.close(self._open.pop(handle).base)
