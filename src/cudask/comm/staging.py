"""A staging area of device memory that a worker's peers map once, through which
device arrays go by CUDA IPC without a mapping of their own allocation.

Covers: `Staging`, the area's slots (first fit, 256-byte aligned, each taken for
one send and given back when its receiver has answered); `install`, which
allocates the area once per process (cudaMalloc, never freed: receivers keep it
mapped while this process runs) and records it as lasting
(cudask.comm.lifetimes.lasting), so the workers of the host map it when they
meet (cudask.comm.ahead) and keep it mapped; `stage`, which copies an array
about to go by handle into a free slot when one is large enough and the array's
own allocation is not lasting (a contiguous copy, in the array's order);
`Slots`, a send's slots, given back when it ends; `stats`. Opening another
process's allocation costs milliseconds between GPUs, a device copy of a few
hundred megabytes a tenth of that (docs/design/device-transfers.md): without
an RMM pool, whose slabs are mapped ahead already, each chunk of CuPy's pool a
peer meets for the first time costs an opening; staged, none does.

Does not cover: when to send by handle and the message (cudask.comm.ipc), the
mappings (cudask.comm.lifetimes), choosing the size
(`cudask.comm.device-ipc-staging`, cudask.comm.settings).

Threading: `stage` runs in serialization threads and on the event loop,
`Slots.release` where the send's `keep_alive` block ends; one lock guards the
area's slots, one each send's.
"""

from __future__ import annotations

import bisect
import logging
import threading
from typing import Any, Protocol

logger = logging.getLogger("cudask.comm")

ALIGN = 256


class Copier(Protocol):
    """The two CUDA calls staging needs (cudask.comm.ipc_cuda.CudaBackend has them)."""

    def allocate_area(self, nbytes: int) -> int: ...

    def stage(self, x: Any, address: int, order: str) -> None: ...


class Staging:
    """Slots of the area [`base`, `base` + `nbytes`)."""

    def __init__(self, base: int, nbytes: int) -> None:
        self.base, self.nbytes = base, nbytes
        self._free: list[tuple[int, int]] = [(base, nbytes)]  # (start, size), by start
        self._taken: dict[int, int] = {}  # start -> size
        self._lock = threading.Lock()
        self.counts = {"staged": 0, "staged-bytes": 0, "staging-full": 0, "staging-failed": 0}

    def take(self, nbytes: int) -> int | None:
        """The address of a free slot of at least `nbytes`, now taken; None when no
        free slot is that large."""
        size = -(-max(nbytes, 1) // ALIGN) * ALIGN
        with self._lock:
            for i, (start, free) in enumerate(self._free):
                if free >= size:
                    self._free[i:i + 1] = [(start + size, free - size)] if free > size else []
                    self._taken[start] = size
                    self.counts["staged"] += 1
                    self.counts["staged-bytes"] += nbytes
                    return start
            self.counts["staging-full"] += 1
            return None

    def give(self, start: int) -> None:
        """Free the slot at `start` (its send has ended), merged with its free neighbours."""
        with self._lock:
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
        """Bytes of the slots taken now."""
        with self._lock:
            return sum(self._taken.values())


_area: Staging | None = None
_copier: Copier | None = None


def install(copier: Copier, nbytes: int) -> Staging:
    """Allocate this process's staging area of `nbytes` (once: later calls return
    the first one) and record it as lasting, for receivers to keep it mapped."""
    global _area, _copier
    from cudask.comm import lifetimes

    if _area is None:
        base = copier.allocate_area(nbytes)
        lifetimes.lasting(base)
        _area, _copier = Staging(base, nbytes), copier
    return _area


def stage(x: Any, nbytes: int, order: str) -> int | None:
    """The address of a contiguous copy of the device array `x` (`nbytes`; `order`
    "C" or "F") in a slot now taken, the copy finished; None when there is no area
    or no slot for it."""
    area, copier = _area, _copier
    if area is None or copier is None or nbytes > area.nbytes:
        return None
    start = area.take(nbytes)
    if start is None:
        return None
    try:
        copier.stage(x, start, order)
    except Exception:  # the array goes from its own allocation instead
        area.give(start)
        area.counts["staging-failed"] += 1
        if area.counts["staging-failed"] == 1:
            logger.warning("cudask: copying a device array into the IPC staging area failed; it "
                           "goes from its own allocation (logged once)", exc_info=True)
        return None
    return start


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

    def release(self) -> None:
        with self._lock:
            self._ended, starts, self._starts = True, self._starts, []
        for start in starts:
            _give(start)


def _give(start: int) -> None:
    if _area is not None:
        _area.give(start)


def stats() -> dict[str, float]:
    """This process's area: its size (0: none), the bytes taken now, and the sends
    staged, their bytes, those that found no slot and those whose copy failed."""
    area = _area
    if area is None:
        return {"staging-bytes": 0, "staging-in-use": 0, "staged": 0, "staged-bytes": 0,
                "staging-full": 0, "staging-failed": 0}
    return {"staging-bytes": area.nbytes, "staging-in-use": area.in_use(), **area.counts}


__all__ = ["ALIGN", "Copier", "Slots", "Staging", "install", "stage", "stats"]
