"""Blocks of host memory that copies go into and out of.

Covers: `HostBlock`, `nbytes` of host memory at `ptr` - a range of a pinned
slab, pageable memory (`pageable`), memory faulted in ahead for one copy
(`mapped`, backed by a `FaultedMapping` that the pool's thread may register
later), or a wrapped buffer (`wrap`) - viewable as a memoryview or a NumPy
array; `BlockPool`, what a block needs from the pool that carved it;
`DeferredBlocks`, blocks released while a copy still uses them, handed back to
their pool once it completes.

Does not cover: carving blocks out of slabs (`cudask.memory.host.pool`) or
deciding when to pin (`cudask.memory.host.provision`).

Threading: a block is used by one copy at a time; `release` may be called
from any thread and returns the memory once (to its pool, which locks, or to
the operating system). `DeferredBlocks` locks itself and hands blocks back
outside its lock. A `FaultedMapping` is unregistered and unmapped when the last
reference to it dies, from whichever thread drops it.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol, cast

import numpy

from cudask.memory.backend import Copy, CopyBackend, address_of, memoryview_at
from cudask.memory.host import faulting
from cudask.memory.host.slabs import Slab

logger = logging.getLogger(__name__)


class BlockPool(Protocol):
    """The pool a pinned block came from."""

    def release_block(self, block: HostBlock, after: Copy | None) -> None:
        """Take `block` back once `after` (a copy into or out of it) has completed."""


class FaultedMapping:
    """A faulted-in anonymous mapping behind one fallback block; registered with
    the driver later by the pool's thread. Unregistered and unmapped when it dies."""

    __slots__ = ("__weakref__", "_state", "ptr", "size")

    def __init__(self, ptr: int, size: int) -> None:
        self.ptr = ptr
        self.size = size
        # [backend that registered it, or None]: read by the finalizer
        self._state: list[CopyBackend | None] = [None]
        weakref.finalize(self, FaultedMapping._free, ptr, size, self._state)

    @property
    def registered(self) -> bool:
        return self._state[0] is not None

    def mark_registered(self, backend: CopyBackend) -> None:
        self._state[0] = backend

    @staticmethod
    def _free(ptr: int, size: int, state: list[CopyBackend | None]) -> None:
        backend = state[0]
        if backend is not None:
            try:
                backend.unregister_host(ptr)
            except Exception:
                logger.debug("cudask: unregistering %#x failed", ptr, exc_info=True)
        faulting.unmap(ptr, size)


class HostBlock:
    """`nbytes` of host memory at `ptr` (pinned or pageable), viewable as `view`."""

    __slots__ = (
        "__weakref__",
        "_keepalive",
        "_offset",
        "_pinned",
        "_pool",
        "_size",
        "_slab",
        "nbytes",
        "ptr",
        "released",
    )

    def __init__(
        self,
        ptr: int,
        nbytes: int,
        *,
        pinned: bool,
        pool: BlockPool | None = None,
        slab: Slab | None = None,
        offset: int = 0,
        size: int = 0,
        keepalive: Any = None,
    ) -> None:
        self.ptr = ptr
        self.nbytes = nbytes
        self._pinned = pinned
        self.released = False
        self._pool = pool
        self._slab = slab
        self._offset = offset
        self._size = size
        self._keepalive = keepalive

    @classmethod
    def pageable(cls, nbytes: int) -> HostBlock:
        array = numpy.empty(max(nbytes, 1), dtype=numpy.uint8)
        return cls(int(array.ctypes.data), nbytes, pinned=False, keepalive=array)

    @classmethod
    def mapped(cls, nbytes: int, threads: int | None = None) -> HostBlock:
        """Pageable memory already faulted in by `threads` threads (falls back to
        `pageable` where the kernel refuses or mappings are unavailable)."""
        if not faulting.available():
            return cls.pageable(nbytes)
        try:
            ptr = faulting.map_populated(nbytes, threads=threads)
        except faulting.HostMemoryError:
            return cls.pageable(nbytes)
        return cls(ptr, nbytes, pinned=False, keepalive=FaultedMapping(ptr, nbytes))

    @classmethod
    def wrap(cls, buffer: Any) -> HostBlock:
        """A block over an existing host buffer (e.g. bytes read back from disk)."""
        view = memoryview(buffer)
        return cls(address_of(view), view.nbytes, pinned=False, keepalive=view)

    @property
    def mapping(self) -> FaultedMapping | None:
        """The faulted-in mapping behind a `mapped` block (None for other blocks)."""
        mapping = self._keepalive
        return mapping if isinstance(mapping, FaultedMapping) else None

    @property
    def pinned(self) -> bool:
        """Whether the block is page-locked now: a fallback block becomes so once
        the pool's thread has registered its mapping."""
        mapping = self._keepalive
        return self._pinned or (isinstance(mapping, FaultedMapping) and mapping.registered)

    @property
    def view(self) -> memoryview:
        if self.released:
            raise ValueError("host block already released")
        if self.nbytes == 0:
            return memoryview(b"")
        if isinstance(self._keepalive, memoryview):
            return self._keepalive.cast("B") if self._keepalive.format != "B" else self._keepalive
        return memoryview_at(self.ptr, self.nbytes)

    @property
    def array(self) -> numpy.ndarray:
        """The block as a uint8 NumPy array (no copy) that keeps the block alive:
        the buffer to hand to pickle and files. A NumPy array never takes part in
        a reference cycle, unlike a memoryview: a memoryview exported to a
        PickleBuffer and caught in a cycle (an exception's traceback holding the
        frames of a failed disk write) cannot be cleared by the garbage collector,
        and on Python 3.12 collecting such a cycle crashes the process."""
        if self.released:
            raise ValueError("host block already released")
        if self.nbytes == 0:
            return numpy.empty(0, dtype=numpy.uint8)
        if isinstance(self._keepalive, memoryview):
            return numpy.frombuffer(self._keepalive, dtype=numpy.uint8)
        raw = (ctypes.c_uint8 * self.nbytes).from_address(self.ptr)
        raw.owner = self  # type: ignore[attr-defined]
        return numpy.frombuffer(cast(Any, raw), dtype=numpy.uint8)

    def release(self, after: Copy | None = None) -> None:
        """Give the memory back (to the pool, or to the operating system), once
        `after` - a copy into or out of this block - has completed."""
        if self.released:
            return
        if self._pool is not None and self._slab is not None:
            self._pool.release_block(self, after)
        else:
            if after is not None:
                after.wait()
            self.released = True
            self._keepalive = None

    def __repr__(self) -> str:
        kind = "pinned" if self.pinned else "pageable"
        return f"<HostBlock {kind} {self.nbytes} B at {self.ptr:#x}>"


class DeferredBlocks:
    """Blocks released while a copy into or out of them was in flight, each handed
    to `give` (its pool's) once its copy has completed."""

    def __init__(self, give: Callable[[HostBlock], None]) -> None:
        self._give = give
        self._lock = threading.Lock()
        self._items: list[tuple[HostBlock, Copy]] = []

    def __bool__(self) -> bool:
        return bool(self._items)

    def add(self, block: HostBlock, copy: Copy) -> None:
        with self._lock:
            self._items.append((block, copy))

    def collect(self, wait: bool = False) -> bool:
        """Hand to `give` the blocks whose copies have completed (all of them,
        waiting for their copies, with `wait`); return whether there were any."""
        done = self._done(wait)
        for block in done:
            self._give(block)
        return bool(done)

    def _done(self, wait: bool) -> list[HostBlock]:
        """Take out the blocks whose copies have completed (all, with `wait`)."""
        with self._lock:
            if not self._items:
                return []
            items, self._items = self._items, []
        done: list[HostBlock] = []
        still: list[tuple[HostBlock, Copy]] = []
        for block, copy in items:
            if wait:
                copy.wait()
            if wait or copy.ready():
                done.append(block)
            else:
                still.append((block, copy))
        if still:
            with self._lock:
                self._items.extend(still)
        return done


__all__ = ["BlockPool", "DeferredBlocks", "FaultedMapping", "HostBlock"]
