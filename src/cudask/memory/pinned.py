"""A pool of pinned (page-locked) host memory for device -> host copies.

Covers: `PinnedPool`, which reserves page-locked host memory from a
`CopyBackend` in large slabs (cudaHostAlloc is slow: about 0.5 s per GiB on a
VM, so it is done rarely), carves blocks out of the slabs first-fit,
coalesces them on release, and falls back to ordinary (pageable) host memory -
with one warning per cause - when the pool's capacity is reached, the driver
refuses to pin more, or (in background mode) no pinned slab is ready yet; and
`HostBlock`, one block of host memory with its address and a memoryview.

Two ways to grow:

- inline (default): `allocate` reserves a new slab itself when none has room,
  so the copy that needs it waits for the pinning;
- background (`start_background(goal)`): a daemon thread ("cudask-pinned")
  reserves slabs up to `goal`, then keeps `headroom` bytes free ahead of use,
  up to the capacity. `allocate` never pins: a request that finds no free
  pinned range asks the thread for more and gets pageable memory for this one
  block (counted in `pageable-fallback-warmup-bytes`), since a pageable copy
  of one chunk (~25 ms per 256 MiB) beats waiting for a slab (~0.5 s per GiB).

Giving memory back (`release_after` seconds): a slab that has been wholly
free for that long returns to the driver, newest first, keeping what
background growth was asked to hold ready (its start goal, and `headroom`
beyond the bytes in use). Without it, slabs stay pinned until `close()`.
The pool's thread ("cudask-pinned") does it; it runs in inline mode too when
`release_after` is set.

Does not cover: copying (`cudask.memory.transfer`) or deciding when memory is
needed (`cudask.memory.store`).

Threading: every method of `PinnedPool` is thread-safe (one lock and a
condition on it; the slow cudaHostAlloc of a new slab runs outside it). A block must not be released
while a copy into or out of it is in flight: `HostBlock.release(after=copy)`
defers the release until the copy has completed.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy

from cudask.memory.transfer import CopyBackend, memoryview_at

if TYPE_CHECKING:
    from cudask.memory.transfer import Copy

logger = logging.getLogger(__name__)

ALIGNMENT = 256


class PinnedMemoryWarning(RuntimeWarning):
    """The pinned pool could not serve a copy; pageable memory is used instead."""


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclass
class _Slab:
    ptr: int
    size: int
    # free ranges: sorted offsets and their sizes
    free_offsets: list[int] = field(default_factory=list)
    free_sizes: list[int] = field(default_factory=list)
    # time.monotonic() since when the slab is wholly free; None while in use
    idle_since: float | None = None

    def __post_init__(self) -> None:
        self.free_offsets = [0]
        self.free_sizes = [self.size]
        self.idle_since = time.monotonic()

    def take(self, nbytes: int) -> int | None:
        for i, size in enumerate(self.free_sizes):
            if size >= nbytes:
                self.idle_since = None
                offset = self.free_offsets[i]
                if size == nbytes:
                    del self.free_offsets[i], self.free_sizes[i]
                else:
                    self.free_offsets[i] += nbytes
                    self.free_sizes[i] -= nbytes
                return offset
        return None

    def give(self, offset: int, nbytes: int) -> None:
        i = bisect.bisect_left(self.free_offsets, offset)
        # merge with the next free range
        if i < len(self.free_offsets) and offset + nbytes == self.free_offsets[i]:
            nbytes += self.free_sizes[i]
            del self.free_offsets[i], self.free_sizes[i]
        # merge with the previous free range
        if i > 0 and self.free_offsets[i - 1] + self.free_sizes[i - 1] == offset:
            self.free_sizes[i - 1] += nbytes
        else:
            self.free_offsets.insert(i, offset)
            self.free_sizes.insert(i, nbytes)
        if self.free_sizes == [self.size]:
            self.idle_since = time.monotonic()

    @property
    def free_bytes(self) -> int:
        return sum(self.free_sizes)

    @property
    def largest_free(self) -> int:
        return max(self.free_sizes, default=0)


class HostBlock:
    """`nbytes` of host memory at `ptr` (pinned or pageable), viewable as `view`."""

    __slots__ = (
        "__weakref__",
        "_keepalive",
        "_offset",
        "_pool",
        "_size",
        "_slab",
        "nbytes",
        "pinned",
        "ptr",
        "released",
    )

    def __init__(
        self,
        ptr: int,
        nbytes: int,
        *,
        pinned: bool,
        pool: PinnedPool | None = None,
        slab: _Slab | None = None,
        offset: int = 0,
        size: int = 0,
        keepalive: Any = None,
    ) -> None:
        self.ptr = ptr
        self.nbytes = nbytes
        self.pinned = pinned
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
    def wrap(cls, buffer: Any) -> HostBlock:
        """A block over an existing host buffer (e.g. bytes read back from disk)."""
        from cudask.memory.transfer import address_of

        view = memoryview(buffer)
        return cls(address_of(view), view.nbytes, pinned=False, keepalive=view)

    @property
    def view(self) -> memoryview:
        if self.released:
            raise ValueError("host block already released")
        if self.nbytes == 0:
            return memoryview(b"")
        if isinstance(self._keepalive, memoryview):
            return self._keepalive.cast("B") if self._keepalive.format != "B" else self._keepalive
        return memoryview_at(self.ptr, self.nbytes)

    def release(self, after: Copy | None = None) -> None:
        """Give the memory back (to the pool, or to Python's allocator), once
        `after` - a copy into or out of this block - has completed."""
        if self.released:
            return
        if self._pool is not None and self._slab is not None:
            self._pool._release(self, after)
        else:
            if after is not None:
                after.wait()
            self.released = True
            self._keepalive = None

    def __repr__(self) -> str:
        kind = "pinned" if self.pinned else "pageable"
        return f"<HostBlock {kind} {self.nbytes} B at {self.ptr:#x}>"


class PinnedPool:
    """Pinned host memory up to `capacity` bytes, reserved `slab_size` at a time.

    `allocate(n)` returns a block from a slab with room, else reserves a new slab
    (of `max(slab_size, n)` rounded to the slab size) if the capacity allows and
    the driver agrees, else returns pageable memory and warns once. Released
    blocks return to their slab; a slab wholly free for `release_after` seconds
    returns to the driver (None: slabs are kept until `close()`).
    """

    def __init__(
        self,
        backend: CopyBackend | None,
        capacity: int,
        slab_size: int,
        *,
        alignment: int = ALIGNMENT,
        release_after: float | None = None,
    ) -> None:
        if capacity < 0 or slab_size < 0:
            raise ValueError(f"capacity={capacity} and slab_size={slab_size} must be >= 0")
        if release_after is not None and release_after < 0:
            raise ValueError(f"release_after={release_after} must be >= 0 seconds or None")
        self.backend = backend
        self.capacity = capacity if backend is not None else 0
        self.slab_size = max(_round_up(slab_size or capacity or 1, alignment), alignment)
        self.alignment = alignment
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._slabs: list[_Slab] = []
        self._reserving = 0  # bytes being reserved by threads outside the lock
        self._pending: list[tuple[HostBlock, Copy]] = []
        self._warned: set[str] = set()
        self._pin_failed = False
        self._closed = False
        self.in_use = 0
        self.pageable_blocks = 0
        self.pageable_bytes = 0
        self.warmup_fallback_bytes = 0
        # the pool's thread: background growth and giving idle slabs back
        self._thread: threading.Thread | None = None
        self._grow_ahead = False  # background growth (start_background was called)
        self.goal = 0  # bytes the background thread reserves up to
        self.keep = 0  # the start goal: never given back
        self.headroom = 0
        self.pin_seconds = 0.0
        self._big = 0  # a request larger than a slab, for the background thread
        self.release_after = release_after
        self.released_bytes = 0
        self._releasing = 0  # bytes out of the pool, being returned to the driver

    # -- introspection -------------------------------------------------------------
    @property
    def reserved(self) -> int:
        """Bytes of pinned memory reserved from the driver (and not yet given back)."""
        return sum(slab.size for slab in self._slabs) + self._releasing

    @property
    def slabs(self) -> int:
        return len(self._slabs)

    # -- allocation ----------------------------------------------------------------
    @property
    def background(self) -> bool:
        """Whether slabs are reserved by the background thread, never by `allocate`."""
        return self._grow_ahead

    def allocate(self, nbytes: int) -> HostBlock:
        """A block of at least `nbytes`; pinned when the pool can serve it."""
        if nbytes == 0 or self.capacity == 0:
            return self._pageable(nbytes, reason=None)
        size = _round_up(nbytes, self.alignment)
        self._collect()
        with self._lock:
            block = self._take(nbytes, size)
            if block is not None:
                if self._grow_ahead:
                    self._ask_ahead(0)
                return block
            if self._grow_ahead and self._can_grow(size):
                # Never wait for cudaHostAlloc on the copy path: ask the background
                # thread for more and use pageable memory for this block.
                self._ask_ahead(size)
                return self._pageable_locked(nbytes, "warmup")
        if not self._grow_ahead and self._grow(size):
            with self._lock:
                block = self._take(nbytes, size)
                if block is not None:
                    return block
        # Copies still in flight may be holding blocks: wait for them and retry.
        if self._collect(wait=True):
            with self._lock:
                block = self._take(nbytes, size)
                if block is not None:
                    return block
        return self._pageable(nbytes, reason="refused" if self._pin_failed else "full")

    def preallocate(self, nbytes: int | None = None) -> int:
        """Reserve slabs up to `nbytes` (default: the capacity) ahead of need, in
        the calling thread; return the bytes reserved."""
        goal = self.capacity if nbytes is None else min(nbytes, self.capacity)
        while (remaining := goal - self.reserved - self._reserving) >= self.alignment:
            if not self._grow(min(self.slab_size, remaining - remaining % self.alignment)):
                break
        return self.reserved

    def start_background(self, goal: int, headroom: int | None = None) -> None:
        """Switch to background growth: a daemon thread reserves slabs up to
        `goal` bytes now, and later keeps `headroom` bytes (default: two slabs)
        free ahead of use, up to the capacity. Returns at once; idempotent."""
        with self._lock:
            if self._closed or self.backend is None or self.capacity == 0:
                return
            self.headroom = 2 * self.slab_size if headroom is None else max(headroom, 0)
            self.goal = max(self.goal, min(goal, self.capacity))
            self.keep = max(self.keep, min(goal, self.capacity))
            self._grow_ahead = True
            self._start_thread()
            self._wake.notify_all()

    def _start_thread(self) -> None:
        """Start the pool's thread unless it runs (lock held)."""
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(
                target=_pool_loop, args=(self,), name="cudask-pinned", daemon=True
            )
            self._thread.start()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the background goal is reserved (or pinning failed, or the
        pool closed); return whether the goal is reserved. True at once in
        inline mode."""
        with self._lock:
            def done() -> bool:
                return (not self._grow_ahead or self._closed or self._pin_failed
                        or self.reserved >= min(self.goal, self.capacity))

            self._wake.wait_for(done, timeout)
            return not self._grow_ahead or self.reserved >= min(self.goal, self.capacity)

    def _can_grow(self, size: int) -> bool:
        """Whether reserving `size` more bytes is allowed (lock held)."""
        return not self._pin_failed and self.reserved + self._reserving + size <= self.capacity

    def _ask_ahead(self, size: int) -> None:
        """Raise the background goal so `size` more bytes plus the headroom are
        free ahead of use (lock held)."""
        if size > self.slab_size:
            self._big = max(self._big, size)
        want = min(self.in_use + size + self.headroom, self.capacity)
        if want > self.goal or self._big:
            self.goal = max(self.goal, want)
            self._wake.notify_all()

    def _take(self, nbytes: int, size: int) -> HostBlock | None:
        for slab in self._slabs:
            offset = slab.take(size)
            if offset is not None:
                self.in_use += size
                return HostBlock(
                    slab.ptr + offset, nbytes, pinned=True, pool=self, slab=slab,
                    offset=offset, size=size,
                )
        return None

    def _grow(self, size: int) -> bool:
        slab_bytes = _round_up(max(size, self.slab_size), self.slab_size)
        with self._lock:
            if self._pin_failed or self.backend is None or self._closed:
                return False
            if self.reserved + self._reserving + slab_bytes > self.capacity:
                slab_bytes = self.capacity - self.reserved - self._reserving
                slab_bytes -= slab_bytes % self.alignment
                if slab_bytes < size or slab_bytes <= 0:
                    return False
            self._reserving += slab_bytes
        started = time.perf_counter()
        try:
            ptr = self.backend.alloc_pinned(slab_bytes)
        except Exception as exc:  # noqa: BLE001 - the driver refused: stop trying
            logger.warning("cudask: pinning %d bytes of host memory failed: %s", slab_bytes, exc)
            with self._lock:
                self._reserving -= slab_bytes
                self._pin_failed = True
                self._wake.notify_all()
            return False
        with self._lock:
            self._reserving -= slab_bytes
            self.pin_seconds += time.perf_counter() - started
            if self._closed:  # closed while pinning: give it straight back
                self.backend.free_pinned(ptr)
                return False
            self._slabs.append(_Slab(ptr, slab_bytes))
            if self.release_after is not None:
                self._start_thread()
            self._wake.notify_all()
        return True

    def _step(self) -> bool:
        """One step of the pool's thread: reserve a slab if below the goal, or
        give back the slabs idle for `release_after`; return False when closed.
        Waits while there is nothing to do."""
        idle: list[_Slab] = []
        size = 0
        with self._lock:
            while True:
                if self._closed:
                    return False
                missing = min(self.goal, self.capacity) - self.reserved - self._reserving
                if (missing >= self.alignment or self._big) and not self._pin_failed:
                    size = min(self.slab_size, max(missing - missing % self.alignment, 0))
                    if self._big:
                        size, self._big = max(size, self._big), 0
                    break
                idle, wait = self._idle_slabs()
                if idle:
                    break
                self._wake.wait(wait)
        if idle:
            self._give_back(idle)
        else:
            self._grow(size)
        return True

    def _idle_slabs(self) -> tuple[list[_Slab], float | None]:
        """Take out of the pool the slabs idle for `release_after`, newest first,
        keeping `keep` bytes and, with background growth, `headroom` beyond the
        bytes in use; also return how long until the next could go (None: until
        woken). Lock held."""
        if self.release_after is None:
            return [], None
        now = time.monotonic()
        keep = max(self.keep, self.in_use + self.headroom) if self._grow_ahead else 0
        reserved = sum(slab.size for slab in self._slabs)
        idle: list[_Slab] = []
        wait: float | None = None
        for slab in reversed(self._slabs):
            if slab.idle_since is None or reserved - slab.size < keep:
                continue
            due = slab.idle_since + self.release_after - now
            if due <= 0:
                idle.append(slab)
                reserved -= slab.size
            else:
                wait = due if wait is None else min(wait, due)
        if idle:
            self._slabs = [slab for slab in self._slabs if all(slab is not i for i in idle)]
            self.goal = min(self.goal, reserved)
            self._releasing += sum(slab.size for slab in idle)
        return idle, wait

    def _give_back(self, slabs: list[_Slab]) -> None:
        """Return wholly free slabs, already out of the pool, to the driver."""
        assert self.backend is not None
        for slab in slabs:
            self.backend.free_pinned(slab.ptr)
        nbytes = sum(slab.size for slab in slabs)
        with self._lock:
            self._releasing -= nbytes
            self.released_bytes += nbytes
        logger.debug("cudask: gave %d bytes of idle pinned memory back", nbytes)

    _REASONS: ClassVar[dict[str, str]] = {
        "full": "the pinned pool is full (memory.pinned-pool-size={capacity} bytes)",
        "refused": "the driver refused to pin more host memory",
        "warmup": "the pinned pool is still being reserved ({reserved} of {goal} bytes ready)",
    }
    _ADVICE: ClassVar[dict[str, str]] = {
        "full": "Raise cudask.memory.pinned-pool-size (e.g. "
                'dask.config.set({{"cudask.memory.pinned-pool-size": "32GiB"}})) to keep them pinned.',
        "refused": "Lower cudask.memory.pinned-pool-size or free locked memory (ulimit -l).",
        "warmup": "Copies go back to pinned memory as it becomes ready; raise "
                  "cudask.memory.pinned-preallocate to pin more when the worker starts.",
    }

    def _pageable(self, nbytes: int, reason: str | None) -> HostBlock:
        if reason is None:
            return HostBlock.pageable(nbytes)
        with self._lock:
            return self._pageable_locked(nbytes, reason)

    def _pageable_locked(self, nbytes: int, reason: str) -> HostBlock:
        """Pageable memory for one block, counted and warned about once per cause
        (lock held; the warning is emitted without it)."""
        self.pageable_blocks += 1
        self.pageable_bytes += nbytes
        if reason == "warmup":
            self.warmup_fallback_bytes += nbytes
        warn = reason not in self._warned
        self._warned.add(reason)
        if warn:
            why = self._REASONS[reason].format(
                capacity=self.capacity, reserved=self.reserved, goal=self.goal
            )
            message = (
                f"cudask: {why}; device -> host copies use pageable memory meanwhile, "
                f"which is several times slower. {self._ADVICE[reason]} "
                "This warning is shown once."
            )
            self._lock.release()
            try:
                logger.warning(message)
                warnings.warn(message, PinnedMemoryWarning, stacklevel=4)
            finally:
                self._lock.acquire()
        return HostBlock.pageable(nbytes)

    # -- release -------------------------------------------------------------------
    def _release(self, block: HostBlock, after: Copy | None) -> None:
        if after is not None and not after.ready():
            with self._lock:
                self._pending.append((block, after))
            return
        self._give(block)

    def _give(self, block: HostBlock) -> None:
        with self._lock:
            if block.released:
                return
            block.released = True
            assert block._slab is not None
            block._slab.give(block._offset, block._size)
            self.in_use -= block._size
            if block._slab.idle_since is not None and self.release_after is not None:
                self._wake.notify_all()  # the pool's thread times its release

    def _collect(self, wait: bool = False) -> bool:
        """Return to the slabs the blocks whose copies completed (all of them when
        `wait`); return whether any were."""
        with self._lock:
            if not self._pending:
                return False
            pending, self._pending = self._pending, []
        done: list[HostBlock] = []
        still: list[tuple[HostBlock, Copy]] = []
        for block, copy in pending:
            if wait:
                copy.wait()
            if wait or copy.ready():
                done.append(block)
            else:
                still.append((block, copy))
        if still:
            with self._lock:
                self._pending.extend(still)
        for block in done:
            self._give(block)
        return bool(done)

    def close(self) -> None:
        """Stop the background thread, wait for pending copies and return every
        slab to the driver. Blocks still in use must not be touched afterwards."""
        with self._lock:
            self._closed = True
            self._wake.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=30)  # at most one cudaHostAlloc in progress
        self._collect(wait=True)
        with self._lock:
            slabs, self._slabs = self._slabs, []
            self.in_use = 0
        for slab in slabs:
            assert self.backend is not None
            self.backend.free_pinned(slab.ptr)

    def stats(self) -> dict[str, float]:
        """Pool state for the store's metrics: capacity, reserved and in-use bytes,
        readiness (1.0 when the background goal is reserved, or in inline mode)
        and pageable fallbacks (all causes; `-warmup-` only those waiting for
        the background thread) and the bytes given back to the driver while idle."""
        with self._lock:
            reserved = self.reserved
            goal = min(self.goal, self.capacity)
            ready = 1.0 if not self._grow_ahead or goal <= 0 else min(reserved / goal, 1.0)
            return {
                "pinned-capacity-bytes": float(self.capacity),
                "pinned-reserved-bytes": float(reserved),
                "pinned-reserving-bytes": float(self._reserving),
                "pinned-goal-bytes": float(goal if self._grow_ahead else reserved),
                "pinned-ready": ready,
                "pinned-in-use-bytes": float(self.in_use),
                "pinned-slabs": float(len(self._slabs)),
                "pinned-seconds": self.pin_seconds,
                "pinned-released-bytes": float(self.released_bytes),
                "pageable-fallback-count": float(self.pageable_blocks),
                "pageable-fallback-bytes": float(self.pageable_bytes),
                "pageable-fallback-warmup-bytes": float(self.warmup_fallback_bytes),
            }


def _pool_loop(pool: PinnedPool) -> None:
    """The pool's thread: reserve slabs as `goal` asks and give idle ones back,
    until closed."""
    try:
        while pool._step():
            pass
    except Exception:  # never kill the worker over pinning
        logger.exception("cudask: the pinned-memory thread stopped")

__all__ = ["ALIGNMENT", "HostBlock", "PinnedMemoryWarning", "PinnedPool"]
