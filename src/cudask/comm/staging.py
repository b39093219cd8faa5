"""A staging area of device memory that a worker's peers map once, through which
device arrays go by CUDA IPC without a mapping of their own allocation.

Covers: `Staging`, the area's slots (first fit, 256-byte aligned, each taken for
one send and given back when its receiver has answered, or `FAILED_HOLD` seconds
after its send failed: its receiver may still be copying from it); `install`,
which allocates the area once per process (cudaMalloc, never freed: receivers
keep it mapped while this process runs; one whose handle cannot be exported is freed at once,
a failure to free it logged) and records it as lasting
(cudask.comm.lifetimes.lasting), so the workers of the host map it when they
meet (cudask.comm.ahead) and keep it mapped; `defer` and `ensure`, which make it
only when first needed (cudask.worker.plugins.DeviceIPC defers it; the worker's
first meeting with a peer of its host, before its offer, or its first send by
IPC ensures it), so a worker alone on its host holds none; `stage`, which copies
an array about to go by handle into a free slot when one is large enough and the
array's own allocation is not lasting (a contiguous copy, in the array's order);
`handle`, the area's IPC handle (exported once) and a slot's offset in it;
`Slots`, a send's slots, given back together; `stats`. Opening another process's
allocation costs milliseconds between GPUs, a device copy of a few hundred
megabytes a tenth of that (docs/design/device-transfers.md): without an RMM
pool, whose slabs are mapped ahead already, each chunk of CuPy's pool a peer
meets for the first time costs an opening; staged, none does. Memory CUDA does
not export at all (RMM's cudaMallocAsync or managed memory) goes by IPC only
through the area.

Does not cover: when to send by handle and the message (cudask.comm.ipc), the
mappings (cudask.comm.lifetimes), choosing the size
(`cudask.comm.device-ipc-staging`, cudask.comm.ipc_settings).

Threading: `stage` (and through it `ensure`) runs in serialization threads and
on the event loop, `ensure` also in the event loop's executor threads
(cudask.comm.ahead), `Slots.release` where the send's `keep_alive` block ends;
one lock makes the area, one guards its slots and counts (held slots whose time
has come are freed by the next call that takes it), one each send's slots.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

logger = logging.getLogger("cudask.comm")

ALIGN = 256
# Seconds the slots of a failed send stay taken: a receiver that had the message before the
# connection failed may still be copying from them.
FAILED_HOLD = 30.0


class Copier(Protocol):
    """The CUDA calls staging needs (cudask.comm.ipc_cuda.CudaBackend has them)."""

    def allocate_area(self, nbytes: int) -> int: ...

    def free_area(self, base: int) -> None: ...

    def export(self, ptr: int) -> tuple[bytes, int]: ...

    def stage(self, x: Any, address: int, order: str) -> None: ...


class Staging:
    """Slots of the area [`base`, `base` + `nbytes`)."""

    def __init__(
        self,
        base: int,
        nbytes: int,
        handle: bytes = b"",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base, self.nbytes = base, nbytes
        self.handle = handle  # the area's IPC handle, exported once
        self._free: list[tuple[int, int]] = [(base, nbytes)]  # (start, size), by start
        self._taken: dict[int, int] = {}  # start -> size
        self._held: dict[int, float] = {}  # start -> when a failed send's slot is free again
        self._clock = clock
        self._lock = threading.Lock()
        self.counts = {"staged": 0, "staged-bytes": 0, "staging-full": 0, "staging-failed": 0}

    def take(self, nbytes: int) -> int | None:
        """The address of a free slot of at least `nbytes`, now taken; None when no
        free slot is that large."""
        size = -(-max(nbytes, 1) // ALIGN) * ALIGN
        with self._lock:
            self._release_held()
            for i, (start, free) in enumerate(self._free):
                if free >= size:
                    self._free[i : i + 1] = [(start + size, free - size)] if free > size else []
                    self._taken[start] = size
                    return start
            self.counts["staging-full"] += 1
            return None

    def count(self, outcome: str, nbytes: int) -> int:
        """Count a copy into a slot, "staged" or "staging-failed"; the count now."""
        with self._lock:
            self.counts[outcome] += 1
            if outcome == "staged":
                self.counts["staged-bytes"] += nbytes
            return self.counts[outcome]

    def give(self, start: int, hold: float = 0.0) -> None:
        """Free the slot at `start` (its send has ended), merged with its free
        neighbours; after `hold` seconds (taken meanwhile) when given."""
        with self._lock:
            self._release_held()
            if hold > 0:
                self._held[start] = self._clock() + hold
                return
            self._free_slot(start)

    def _release_held(self) -> None:
        """Free the held slots whose time has come (the caller holds the lock)."""
        now = self._clock()
        for start in [s for s, until in self._held.items() if until <= now]:
            del self._held[start]
            self._free_slot(start)

    def _free_slot(self, start: int) -> None:
        """The slot at `start` back among the free ones (the caller holds the lock)."""
        size = self._taken.pop(start)
        i = bisect.bisect(self._free, (start, 0))
        if i < len(self._free) and self._free[i][0] == start + size:
            size += self._free.pop(i)[1]
        if i > 0 and sum(self._free[i - 1]) == start:
            start, size = self._free[i - 1][0], self._free[i - 1][1] + size
            i -= 1
            self._free.pop(i)
        self._free.insert(i, (start, size))

    def in_use(self) -> int:
        """Bytes of the slots taken now (held ones whose time has come freed first)."""
        with self._lock:
            return self._in_use_locked()

    def figures(self) -> dict[str, float]:
        """The bytes of the slots taken now (`staging-in-use`) and the counts, read together."""
        with self._lock:
            return {"staging-in-use": self._in_use_locked(), **self.counts}

    def _in_use_locked(self) -> int:
        """`in_use`'s work (the caller holds `_lock`)."""
        self._release_held()
        return sum(self._taken.values())


_area: Staging | None = None
_copier: Copier | None = None
_pending: tuple[Copier, int] | None = None  # the area `ensure` makes when first needed
_installing = threading.Lock()  # a peer met and a first send may make the area at once


def install(copier: Copier, nbytes: int) -> Staging:
    """Allocate this process's staging area of `nbytes` (once: later calls return
    the first one) and record it as lasting, for receivers to keep it mapped."""
    with _installing:
        return _make(copier, nbytes)


def _make(copier: Copier, nbytes: int) -> Staging:
    """`install`'s work (the caller holds `_installing`)."""
    global _area, _copier
    from cudask.comm import lifetimes

    if _area is None:
        base = copier.allocate_area(nbytes)
        try:
            handle, _ = copier.export(base)
        except BaseException:
            _free_unexported(copier, base)
            raise
        lifetimes.lasting(base)
        _area, _copier = Staging(base, nbytes, handle), copier
    return _area


def _free_unexported(copier: Copier, base: int) -> None:
    """Give the area at `base`, whose handle could not be exported, back to the GPU; a
    failure to free it is logged, so the export's error is the one that propagates."""
    try:
        copier.free_area(base)
    except Exception:  # the export's error is the one to report
        logger.warning(
            "cudask: freeing an IPC staging area whose handle could not be exported "
            "failed; its memory stays allocated",
            exc_info=True,
        )


def defer(copier: Copier, nbytes: int) -> None:
    """Have `ensure` make the area of `nbytes` when it is first needed."""
    global _pending
    with _installing:
        if _area is None:
            _pending = (copier, nbytes)


def ensure() -> Staging | None:
    """The area, made now if `defer` asked for one and it is not made yet; None
    without one. A refusal (CUDA out of memory; an area whose handle cannot be exported
    is freed first) is logged and not tried again: arrays then go from their own
    allocations."""
    global _pending
    if _area is not None or _pending is None:
        return _area
    with _installing:
        pending, _pending = _pending, None
        if pending is None:
            return _area
        try:
            return _make(*pending)
        except Exception as exc:  # noqa: BLE001 - an optimisation: IPC works without it
            logger.warning(
                "cudask: no IPC staging area of %d bytes (%s): arrays go by their own allocations",
                pending[1],
                exc,
            )
            return None


def stage(x: Any, nbytes: int, order: str) -> int | None:
    """The address of a contiguous copy of the device array `x` (`nbytes`; `order`
    "C" or "F") in a slot now taken, the copy finished; None when there is no area
    or no slot for it."""
    area, copier = ensure(), _copier
    if area is None or copier is None or nbytes > area.nbytes:
        return None
    start = area.take(nbytes)
    if start is None:
        return None
    try:
        copier.stage(x, start, order)
    except Exception:  # the array goes from its own allocation instead
        area.give(start)
        if area.count("staging-failed", nbytes) == 1:
            logger.warning(
                "cudask: copying a device array into the IPC staging area failed; it "
                "goes from its own allocation (logged once)",
                exc_info=True,
            )
        return None
    area.count("staged", nbytes)
    return start


def handle(slot: int) -> tuple[bytes, int]:
    """The area's IPC handle and `slot`'s offset in it (exported once, at `install`)."""
    area = _area
    assert area is not None  # a slot was taken from it
    return area.handle, slot - area.base


class Slots:
    """The slots one send took (`add`), given back together when it ends (`release`);
    a slot added after that is given back at once (a serialization thread that
    outlived its send)."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ended = False
        self._lock = threading.Lock()

    def add(self, start: int) -> None:
        with self._lock:
            if not self._ended:
                self._starts.append(start)
                return
        _give(start)

    def release(self, failed: bool = False) -> None:
        """Give the slots back: at once, or `FAILED_HOLD` seconds from now when the
        send `failed` (its receiver may still be copying from them)."""
        with self._lock:
            self._ended, starts, self._starts = True, self._starts, []
        for start in starts:
            _give(start, FAILED_HOLD if failed else 0.0)


def _give(start: int, hold: float = 0.0) -> None:
    if _area is not None:
        _area.give(start, hold)


def stats() -> dict[str, float]:
    """This process's area: its size (0: none), the bytes taken now, and the sends
    staged, their bytes, those that found no slot and those whose copy failed."""
    area = _area
    if area is None:
        return {
            "staging-bytes": 0,
            "staging-in-use": 0,
            "staged": 0,
            "staged-bytes": 0,
            "staging-full": 0,
            "staging-failed": 0,
        }
    return {"staging-bytes": area.nbytes, **area.figures()}


__all__ = [
    "ALIGN",
    "FAILED_HOLD",
    "Copier",
    "Slots",
    "Staging",
    "defer",
    "ensure",
    "handle",
    "install",
    "stage",
    "stats",
]
