"""Spill on demand: device allocations held to the limit, and out-of-memory turned into spilling.

Covers: `SpillOnDemand`, which hooks CuPy's allocator and the current RMM
resource (`cudask.memory.allocators`) for a store. With a device limit, an
allocation that would take the process's reserved device memory past it
(CuPy's default pool counting its cached free blocks, plus what was allocated
through RMM) first has the store spill its least recently used keys by what is
over the limit without CuPy's cached blocks, then gives those back
(`make_room`); when the store has nothing left to spill the allocation goes
ahead. An allocation that
fails for want of device memory has the store spill what the driver reports
missing and is tried again (doubling the amount each time); when that fails
too, CuPy's allocations raise a `MemoryError` naming the task, the bytes asked
for, what was spilled for it, what the GPU had free after and the limit. Both stores use it: the tiered store
(`cudask.memory.store`) and the JIT-unspill store
(`cudask.memory.jit.proxy_store`), when `cudask.memory.spill-on-demand` is on.

Does not cover: what is spilled (the store's least recently used keys), the
allocators of PyTorch and Numba (not hooked: docs/memory.md says what is held).

Threading: spilling runs in the thread whose allocation asked for it; an
allocation made while that thread is spilling neither waits for the limit
nor spills again. Spilling a store waits at most `STORE_LOCK_WAIT` for the
store's lock (`SpillOnDemand.for_store`). Below the limit an allocation costs
one read of the counters and one comparison.
"""

from __future__ import annotations

import logging
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from dask.utils import format_bytes

from cudask.memory.allocators import CupyHook, RmmHook, current_task

logger = logging.getLogger("cudask.memory")

# Seconds an allocation spilling a store on demand waits for the store's lock
# (`SpillOnDemand.for_store`).
STORE_LOCK_WAIT = 1.0

# Spilling for an allocation the driver refused asks for this much more than
# the driver reports missing (its page granularity), at most 1% of the request.
_MARGIN = 2 << 20


class SpillableStore(Protocol):
    """What `SpillOnDemand.for_store` calls of a store (cudask.memory.store.TieredStore)."""

    @property
    def closed(self) -> bool: ...

    def spill_device(self, nbytes: int, lock_wait: float | None = None) -> int: ...

    def free_device_memory(self) -> int | None: ...


class SpillOnDemand:
    """Hold device allocations to `limit` and turn out-of-memory into spilling.

    `spill(nbytes)` releases device memory (waiting for the copies) and returns
    how many bytes it freed. `limit`: the device limit allocations are held to
    (None: only out-of-memory spills). `free_memory()`: the device memory the
    driver reports free, or None when unknown. `install()` hooks the allocators
    of the libraries already imported in this process (CuPy, RMM);
    `uninstall()` restores what was there, when it is still ours.
    """

    def __init__(
        self,
        spill: Callable[[int], int],
        attempts: int = 4,
        *,
        limit: int | None = None,
        free_memory: Callable[[], int | None] | None = None,
    ) -> None:
        self._spill = spill
        self.attempts = attempts
        self.limit = limit
        self._free_memory = free_memory
        self._local = threading.local()
        self.count = 0  # spills for allocations the device refused
        self.freed = 0
        self.limit_count = 0  # spills for allocations past the limit
        self.limit_freed = 0
        self._readers: list[Callable[[], int]] = []
        self._cache_readers: list[Callable[[], int]] = []
        self._releasers: list[Callable[[], None]] = []
        self._cupy: CupyHook | None = None
        self._rmm: RmmHook | None = None

    @classmethod
    def for_store(cls, store: SpillableStore, limit: int | None) -> SpillOnDemand:
        """Spill on demand for `store`, held weakly so the hooks never
        keep it alive. Its spills wait at most `STORE_LOCK_WAIT` for the store's lock:
        the allocating thread may hold a lock that a thread holding the store's lock
        waits for (cuDF holds a buffer's lock while it unspills it, and serializing
        that buffer for a spill takes the same lock); past the wait nothing is
        spilled and the allocation goes ahead."""
        ref = weakref.ref(store)

        def spill(nbytes: int) -> int:
            s = ref()
            return 0 if s is None or s.closed else s.spill_device(nbytes, STORE_LOCK_WAIT)

        def free() -> int | None:
            s = ref()
            return None if s is None or s.closed else s.free_device_memory()

        return cls(spill, limit=limit, free_memory=free)

    # ------------------------------------------------------------------ spilling
    def _spill_now(self, nbytes: int) -> int:
        """Spill at least `nbytes`; 0 when called from within a spill."""
        if getattr(self._local, "busy", False):
            return 0
        self._local.busy = True
        try:
            return max(int(self._spill(max(int(nbytes), 1))), 0)
        except Exception:
            logger.exception("cudask: spilling on demand failed")
            return 0
        finally:
            self._local.busy = False

    def spill(self, nbytes: int) -> int:
        """Spill at least `nbytes` for an allocation the device refused; 0 when
        called from within a spill (an allocation made while spilling must not
        spill again)."""
        freed = self._spill_now(nbytes)
        if freed > 0:
            self.count += 1
            self.freed += freed
        logger.debug(
            "cudask: spill on demand for %s released %s", format_bytes(nbytes), format_bytes(freed)
        )
        return freed

    def reserved(self) -> int:
        """Device bytes the hooked allocators hold now (cached free blocks too)."""
        return sum(read() for read in self._readers)

    def make_room(self, nbytes: int) -> None:
        """Before allocating `nbytes` past the limit: spill the store's least
        recently used keys by what would still be over it without the allocators'
        cached free blocks, then give those blocks back. When nothing could be
        spilled and the caches alone do not make room (the running tasks' own
        memory is past the limit), the caches stay, to serve those tasks."""
        limit = self.limit
        if limit is None or getattr(self._local, "busy", False):
            return
        reserved = self.reserved()
        if reserved + nbytes <= limit:
            return
        over = reserved - self._cached() + nbytes - limit
        freed = 0
        for _ in range(self.attempts):
            if freed >= over:
                break
            step = self._spill_now(over - freed)
            if step <= 0:
                break
            freed += step
        if freed:
            self.limit_count += 1
            self.limit_freed += freed
        if freed or over <= 0:
            self._release_cached()  # with what the spilled keys gave back to them

    def _cached(self) -> int:
        """Free blocks the allocators keep cached (counted in `reserved`)."""
        return sum(read() for read in self._cache_readers)

    def _release_cached(self) -> None:
        for release in self._releasers:
            try:
                release()
            except Exception:  # a cache that cannot shrink: spill instead
                logger.debug("cudask: giving cached device memory back failed", exc_info=True)

    def shortfall(self, nbytes: int) -> int:
        """How much to spill for a refused allocation of `nbytes`: what the driver
        reports missing (plus a margin), or `nbytes` when that is not known or
        says nothing is missing (an RMM pool at its maximum size, say)."""
        free = self._free_memory() if self._free_memory is not None else None
        if free is None or not 0 < nbytes - free < nbytes:
            return nbytes
        return min(nbytes - free + min(_MARGIN, nbytes // 100), nbytes)

    # ------------------------------------------------------------------ hooks
    def wrap_allocator(
        self,
        malloc: Callable[[int], Any],
        oom: tuple[type[BaseException], ...],
        reserved: Callable[[], int] | None = None,
    ) -> Callable[[int], Any]:
        """`malloc` held to the limit (when this hook has a limit and counters:
        `reserved`, which joins them, or those `install` found) that, when it
        raises one of `oom`, spills and retries, then raises a MemoryError
        naming the task."""
        limit = self.limit
        if reserved is not None:
            self._readers.append(reserved)
        readers = self._readers
        gate = limit is not None and bool(readers)
        read = readers[0] if len(readers) == 1 else self.reserved

        def allocate(nbytes: int) -> Any:
            if gate and read() + nbytes > limit:  # type: ignore[operator]
                self.make_room(nbytes)
            try:
                return malloc(nbytes)
            except oom as exc:
                first = exc
            return self._after_refusal(malloc, nbytes, oom, first)

        allocate.__wrapped__ = malloc  # type: ignore[attr-defined]
        return allocate

    def _after_refusal(
        self,
        malloc: Callable[[int], Any],
        nbytes: int,
        oom: tuple[type[BaseException], ...],
        first: BaseException,
    ) -> Any:
        """Spill and retry a refused allocation; a named MemoryError when it fails."""
        want = self.shortfall(nbytes)
        spilled = 0
        for _ in range(self.attempts):
            step = self.spill(want)
            if step <= 0:
                break
            spilled += step
            try:
                return malloc(nbytes)
            except oom:
                want *= 2
        raise MemoryError(self.refusal(nbytes, first, spilled)) from first

    def refusal(self, nbytes: int, error: BaseException, spilled: int = 0) -> str:
        """The message of a MemoryError for an allocation spilling could not serve;
        `spilled`: the bytes spilled for it."""
        task = current_task()
        who = "an allocation outside any task" if task is None else f"task {task!r}"
        limit = "None" if self.limit is None else f"{format_bytes(self.limit)} ({self.limit} bytes)"
        try:
            free = self._free_memory() if self._free_memory is not None else None
        except Exception:  # noqa: BLE001 - the message must not fail for want of a figure
            free = None
        seen = (
            f"{format_bytes(spilled)} spilled for it"
            + (": every device key in use, or the store busy" if not spilled else "")
            + ("" if free is None else f", {format_bytes(free)} free on the GPU after that")
        )
        return (
            f"cudask: {who} asked for {format_bytes(nbytes)} ({nbytes} bytes) of device "
            f"memory and the GPU is out of memory after spilling what could be spilled "
            f"({seen}; device_memory_limit={limit}): it needs more than the GPU has free. "
            f"Split the work into smaller chunks. ({type(error).__name__}: {error})"
        )

    def rmm_callback(self, nbytes: int) -> bool:
        """Spill for a refused RMM allocation; True (retry it) when something was
        released."""
        if self.spill(self.shortfall(nbytes)) > 0:
            return True
        logger.warning(
            "cudask: task %r: RMM could not allocate %s after spilling (device_memory_limit=%s)",
            current_task(),
            format_bytes(nbytes),
            "None" if self.limit is None else format_bytes(self.limit),
        )
        return False

    def install(self) -> None:
        """Hook the current RMM resource and CuPy's allocator, for libraries already
        imported (importing them here would be a cost, not a help)."""
        if self._rmm is None and "rmm" in sys.modules:
            gate = self.make_room if self.limit is not None else None
            self._rmm = RmmHook(gate, self.rmm_callback)
            if gate is not None:
                self._readers.append(self._rmm.reserved)
        if self._cupy is None and "cupy" in sys.modules:
            self._cupy = CupyHook(self._wrap_cupy)
            if self._cupy.release is not None and self._cupy.cached is not None:
                self._releasers.append(self._cupy.release)
                self._cache_readers.append(self._cupy.cached)

    def _wrap_cupy(
        self, malloc: Callable[[int], Any], reserved: Callable[[], int] | None
    ) -> Callable[[int], Any]:
        import cupy

        return self.wrap_allocator(
            malloc, (cupy.cuda.memory.OutOfMemoryError, MemoryError), reserved
        )

    def uninstall(self) -> None:
        for hook in (self._cupy, self._rmm):
            if hook is not None:
                hook.remove()
        self._cupy = self._rmm = None
        self._readers.clear()
        self._cache_readers.clear()
        self._releasers.clear()

    @property
    def installed(self) -> list[str]:
        return [name for name, hook in (("cupy", self._cupy), ("rmm", self._rmm)) if hook]
