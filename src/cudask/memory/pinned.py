"""A pool of pinned (page-locked) host memory for device -> host copies.

Covers: `PinnedPool`, which keeps page-locked host memory in slabs, carves
blocks out of them first-fit and coalesces them on release; `HostBlock`, one
block of host memory with its address and a memoryview.

How memory becomes pinned (`method`, measured on an H100 VM, issue 13):

- "register" (default where Linux allows): anonymous memory advised for huge
  pages and faulted in by several threads (`cudask.memory.hostmem`), then
  registered with the driver (cudaHostRegister, 33-37 GB/s for such memory).
  With `duty_cycle` 1 (no rests) the next slab is faulted in while the
  current one is registered. 6-7 GB/s on memory the VM never touched,
  26-28 GB/s on memory it had;
- "host-alloc": cudaHostAlloc, which faults pages in one thread: 1.25 GB/s.

If registration fails, the pool warns once naming the cause and goes on
with "host-alloc".

Pinning competes with the worker's GPU work: cudaHostRegister holds a lock
of the process's CUDA driver state for as long as it takes, and kernel
launches, synchronizations and copies of every thread of the process wait
for it; other processes' cudaMalloc and CUDA IPC opens wait too (a lock of
the driver's memory mappings); faulting memory in delays this process's
cudaMalloc and IPC opens (`cudask.memory.hostmem`). Measured on an H100 VM
(scripts/pin-interference): while a pool grew in 1 GiB slabs, a kernel loop
in the same process stalled up to 120-330 ms at a time, and a 12.8 GB
all-to-all between two workers of one GPU took 0.6-1.9 s instead of 0.2.
Two bounds: the slab size (each slab is one registration;
`memory.pinned-slab-size`), and `duty_cycle`, the largest share
of time the pool's thread spends pinning or registering (after t seconds of
it, it rests t * (1 / duty_cycle - 1), leaving gaps in which the other
threads' CUDA calls go through). The store passes `memory.pinned-slab-size`,
256 MiB by default (H100: a kernel loop's 99th percentile 11 ms instead of
66 with 1 GiB slabs, the all-to-all 0.54 s instead of 0.94, and the cold spill
as fast or faster; alternating runs), and `memory.pinned-duty-cycle`, 1 (no
rests) by default: resting also delays the registration of fallback blocks,
and a cold spill read its data back 5x slower with 0.5 (two runs).

The copy path never waits for pinning. A daemon thread ("cudask-pinned")
reserves slabs up to a goal: the start goal (`start_background`) and what
the store asks to have free ahead of its spills (`ensure_free`). `allocate`
only carves: a request that finds no free pinned range asks the thread for
more and gets a fallback block for this one copy: memory faulted in by the
same threads (a device -> host copy into it runs ~11 GB/s, against ~2.4 GB/s
into fresh pageable memory), which the thread registers later, when it has
nothing else to do, so the copy back to the device runs at pinned speed.

Footprint: reserved slabs never exceed `capacity`, nor `available_fraction`
of the memory that would be available without them (MemAvailable plus what
the pool holds), checked before every slab. A slab wholly free for
`release_after` seconds goes back to the operating system, newest first,
keeping the start goal; without `release_after` slabs stay until `close()`,
or until `trim()` (the store calls it when the worker's memory manager moves
data to disk) gives every free one back at once.

Does not cover: copying (`cudask.memory.transfer`) or deciding how much is
needed (`cudask.memory.store`).

Threading: every method of `PinnedPool` is thread-safe (one lock and a
condition on it; faulting in and registering run outside it). A block must
not be released while a copy into or out of it is in flight:
`HostBlock.release(after=copy)` defers the release until the copy has
completed.
"""

from __future__ import annotations

import bisect
import ctypes
import logging
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, cast

import numpy

from cudask.memory import hostmem
from cudask.memory.transfer import CopyBackend, memoryview_at

if TYPE_CHECKING:
    from cudask.memory.transfer import Copy

logger = logging.getLogger(__name__)

ALIGNMENT = 256
METHODS = ("auto", "register", "host-alloc")
# fallback blocks from this size on are faulted-in mappings (registered later)
MAPPED_FALLBACK_FROM = 1 << 20


class PinnedMemoryWarning(RuntimeWarning):
    """The pinned pool could not serve a copy; pageable memory is used instead."""


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _out_of_memory(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or "out of memory" in text or "memoryallocation" in text


def _available_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


@dataclass
class _Slab:
    ptr: int
    size: int
    registered: bool  # cudaHostRegister'ed mapping (else cudaHostAlloc)
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


class _Mapping:
    """A faulted-in anonymous mapping behind one fallback block; registered with
    the driver later by the pool's thread. Unregistered and unmapped when it dies."""

    __slots__ = ("__weakref__", "_state", "ptr", "size")

    def __init__(self, ptr: int, size: int) -> None:
        self.ptr = ptr
        self.size = size
        # [backend that registered it, or None]: read by the finalizer
        self._state: list[CopyBackend | None] = [None]
        weakref.finalize(self, _Mapping._free, ptr, size, self._state)

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
        hostmem.unmap(ptr, size)


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
        pool: PinnedPool | None = None,
        slab: _Slab | None = None,
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
        if not hostmem.available():
            return cls.pageable(nbytes)
        try:
            ptr = hostmem.map_populated(nbytes, threads=threads)
        except hostmem.HostMemoryError:
            return cls.pageable(nbytes)
        return cls(ptr, nbytes, pinned=False, keepalive=_Mapping(ptr, nbytes))

    @classmethod
    def wrap(cls, buffer: Any) -> HostBlock:
        """A block over an existing host buffer (e.g. bytes read back from disk)."""
        from cudask.memory.transfer import address_of

        view = memoryview(buffer)
        return cls(address_of(view), view.nbytes, pinned=False, keepalive=view)

    @property
    def pinned(self) -> bool:
        """Whether the block is page-locked now: a fallback block becomes so once
        the pool's thread has registered its mapping."""
        mapping = self._keepalive
        return self._pinned or (isinstance(mapping, _Mapping) and mapping.registered)

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
    """Pinned host memory up to `capacity` bytes, reserved `slab_size` at a time
    by a background thread; see the module docstring.

    `method`: "auto" (register where possible), "register" or "host-alloc".
    `available`: bytes of host memory available now (default: psutil's
    MemAvailable); `available_fraction`: the most of it (plus what the pool
    holds) the pool pins. `populate_threads`: threads faulting memory in
    (None: `hostmem.default_threads()`). `duty_cycle`: the largest share of
    time the pool's thread spends pinning (slabs and fallback blocks), in
    (0, 1]; 1: no rests.
    """

    def __init__(
        self,
        backend: CopyBackend | None,
        capacity: int,
        slab_size: int,
        *,
        alignment: int = ALIGNMENT,
        release_after: float | None = None,
        method: str = "auto",
        available: Callable[[], int] | None = None,
        available_fraction: float = 0.5,
        populate_threads: int | None = None,
        duty_cycle: float = 1.0,
    ) -> None:
        if capacity < 0 or slab_size < 0:
            raise ValueError(f"capacity={capacity} and slab_size={slab_size} must be >= 0")
        if release_after is not None and release_after < 0:
            raise ValueError(f"release_after={release_after} must be >= 0 seconds or None")
        if method not in METHODS:
            raise ValueError(f"method={method!r}; accepted: {', '.join(METHODS)}")
        if not 0 < available_fraction <= 1:
            raise ValueError(f"available_fraction={available_fraction} must be in (0, 1]")
        if not 0 < duty_cycle <= 1:
            raise ValueError(f"duty_cycle={duty_cycle} must be in (0, 1]")
        self.backend = backend
        self.capacity = capacity if backend is not None else 0
        self.slab_size = max(_round_up(slab_size or capacity or 1, alignment), alignment)
        self.alignment = alignment
        if method == "auto":
            method = "register" if hostmem.available() else "host-alloc"
        self.method = method
        self.available = available or _available_memory
        self.available_fraction = available_fraction
        self.populate_threads = populate_threads
        self.duty_cycle = duty_cycle
        self.rest_seconds = 0.0  # the pool's thread rested this long between pinnings
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
        # the pool's thread: growth, registering fallback blocks, giving idle slabs back
        self._thread: threading.Thread | None = None
        self._mapper: ThreadPoolExecutor | None = None  # faults the next slab in
        self._premapped: Future[int] | None = None
        self._premapped_size = 0
        self.goal = 0  # bytes the thread reserves up to
        self.keep = 0  # the start goal: never given back
        self.headroom = 0
        self._big = 0  # a request larger than a slab, for the thread
        self.release_after = release_after
        self._trim = False  # give every wholly free slab back now (trim())
        self.released_bytes = 0
        self._releasing = 0  # bytes out of the pool, being returned to the driver
        # fallback blocks waiting to be registered (weak: they may die first)
        self._to_register: deque[weakref.ref[_Mapping]] = deque()
        self.registered_fallback = 0  # bytes of fallback blocks registered, still alive
        # provisioning figures: bytes made ready and the seconds it took
        self.provisioned_bytes = 0
        self.provision_seconds = 0.0
        self.upgraded_bytes = 0
        self.upgrade_seconds = 0.0

    # -- introspection -------------------------------------------------------------
    @property
    def reserved(self) -> int:
        """Bytes of pinned memory reserved in slabs (and not yet given back)."""
        return sum(slab.size for slab in self._slabs) + self._releasing

    @property
    def slabs(self) -> int:
        return len(self._slabs)

    # -- allocation ----------------------------------------------------------------
    def allocate(self, nbytes: int) -> HostBlock:
        """A block of at least `nbytes`: pinned when a free pinned range is ready,
        else a fallback block (never waits for pinning)."""
        if nbytes == 0 or self.capacity == 0:
            return HostBlock.pageable(nbytes)
        size = _round_up(nbytes, self.alignment)
        self._collect()
        with self._lock:
            block = self._take(nbytes, size)
            if block is not None:
                self._ask_ahead(0)
                return block
        # Copies still in flight may be holding blocks (for milliseconds at bus
        # speed): wait for them and retry before falling back.
        if self._collect(wait=True):
            with self._lock:
                block = self._take(nbytes, size)
                if block is not None:
                    return block
        with self._lock:
            reason = self._why_not(size)
            if reason == "warmup":
                self._ask_ahead(size)
        return self._fallback(nbytes, reason)

    def preallocate(self, nbytes: int | None = None) -> int:
        """Reserve slabs up to `nbytes` (default: the capacity) in the calling
        thread; return the bytes reserved."""
        goal = self.capacity if nbytes is None else min(nbytes, self.capacity)
        while (remaining := goal - self.reserved - self._reserving) >= self.alignment:
            if not self._grow(min(self.slab_size, remaining - remaining % self.alignment)):
                break
        return self.reserved

    def start_background(self, goal: int, headroom: int | None = None) -> None:
        """Reserve `goal` bytes in the background now and keep them (never given
        back while idle); later keep `headroom` bytes (default: two slabs) free
        ahead of use, up to the capacity. Returns at once; idempotent."""
        with self._lock:
            if self._closed or self.backend is None or self.capacity == 0:
                return
            self.headroom = 2 * self.slab_size if headroom is None else max(headroom, 0)
            self.goal = max(self.goal, min(goal, self.capacity))
            self.keep = max(self.keep, min(goal, self.capacity))
            self._start_thread()
            self._wake.notify_all()

    def ensure_free(self, nbytes: int) -> None:
        """Have `nbytes` of pinned memory free ahead of use (beyond the bytes in
        use), reserved in the background up to the capacity. Cheap when already
        asked: callable on every write."""
        with self._lock:
            if self._closed or self.backend is None or self.capacity == 0:
                return
            want = min(self.in_use + max(nbytes, 0), self.capacity)
            if want - self.goal >= self.alignment:
                self.goal = want
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
        """Wait until the goal is reserved (or pinning failed, the footprint limit
        was reached, or the pool closed); return whether the goal is reserved."""
        with self._lock:
            def done() -> bool:
                return (self._closed or self._pin_failed
                        or (self._limited() and not self._reserving)
                        or self.reserved >= min(self.goal, self.capacity))

            self._wake.wait_for(done, timeout)
            return self.reserved >= min(self.goal, self.capacity)

    def _limited(self) -> bool:
        """Whether one more slab would pass the available-memory limit (lock held)."""
        return not self._fits(self.slab_size)

    def _fits(self, size: int) -> bool:
        """Whether `size` more pinned bytes stay within the capacity and the
        available-memory limit (lock held)."""
        held = self.reserved + self._reserving + self.registered_fallback
        if held + size > self.capacity:
            return False
        return held + size <= self.available_fraction * (self.available() + held)

    def _why_not(self, size: int) -> str:
        """Why no pinned range serves `size` bytes now (lock held)."""
        if self._pin_failed:
            return "refused"
        if self.reserved + self._reserving + size > self.capacity:
            return "full"
        if not self._fits(size):
            return "available"
        return "warmup"

    def _ask_ahead(self, size: int) -> None:
        """Raise the goal so `size` more bytes plus the headroom are free ahead of
        use (lock held)."""
        if size > self.slab_size:
            self._big = max(self._big, size)
        want = min(self.in_use + size + self.headroom, self.capacity)
        if want > self.goal or self._big or self.reserved + self._reserving < self.goal:
            # (a goal not met may have waited for memory to become available)
            self.goal = max(self.goal, want)
            self._start_thread()
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

    # -- growth --------------------------------------------------------------------
    def _grow(self, size: int, premap: bool = False) -> bool:
        """Reserve one slab of at least `size` bytes (outside the lock); with
        `premap` (the pool's thread), fault the next slab in meanwhile when the
        goal needs one."""
        slab_bytes = _round_up(max(size, self.slab_size), self.slab_size)
        with self._lock:
            if self._pin_failed or self.backend is None or self._closed:
                return False
            if self.reserved + self._reserving + slab_bytes > self.capacity:
                slab_bytes = self.capacity - self.reserved - self._reserving
                slab_bytes -= slab_bytes % self.alignment
                if slab_bytes < size or slab_bytes <= 0:
                    return False
            if not self._fits(slab_bytes):
                return False
            self._reserving += slab_bytes
            more = premap and (
                min(self.goal, self.capacity) - self.reserved - self._reserving >= self.slab_size
            )
        started = time.perf_counter()
        try:
            ptr, registered = self._pin(slab_bytes, premap_next=more)
        except Exception as exc:  # noqa: BLE001 - the driver or kernel refused: stop trying
            self._warn_once("refused", f"pinning {slab_bytes} bytes of host memory failed: {exc}")
            with self._lock:
                self._reserving -= slab_bytes
                self._pin_failed = True
                self._wake.notify_all()
            return False
        seconds = time.perf_counter() - started
        with self._lock:
            self._reserving -= slab_bytes
            self.provisioned_bytes += slab_bytes
            self.provision_seconds += seconds
            if self._closed:  # closed while pinning: give it straight back
                self._free_slab(_Slab(ptr, slab_bytes, registered))
                return False
            self._slabs.append(_Slab(ptr, slab_bytes, registered))
            self._wake.notify_all()
        return True

    def _pin(self, nbytes: int, *, premap_next: bool) -> tuple[int, bool]:
        """Page-locked memory of `nbytes`: (address, registered). Registration
        failures switch the pool to cudaHostAlloc (one warning)."""
        assert self.backend is not None
        if self.method == "register":
            ptr = self._mapped_slab(nbytes)
            if premap_next:
                self._premap(self.slab_size)
            try:
                self.backend.register_host(ptr, nbytes)
                return ptr, True
            except Exception as exc:
                hostmem.unmap(ptr, nbytes)
                if _out_of_memory(exc):
                    self._drop_premapped()
                    raise  # the driver refuses to pin more: so would cudaHostAlloc
                self.method = "host-alloc"
                self._drop_premapped()
                self._warn_once(
                    "register",
                    f"registering host memory with the driver failed ({exc}); pinning "
                    "with cudaHostAlloc instead, which is several times slower",
                )
        return self.backend.alloc_pinned(nbytes), False

    def _mapped_slab(self, nbytes: int) -> int:
        """A faulted-in mapping of `nbytes`: the one faulted in ahead if it fits."""
        future, size = self._premapped, self._premapped_size
        self._premapped = None
        if future is not None:
            try:
                ptr = future.result()
            except hostmem.HostMemoryError:
                ptr = 0
            if ptr and size == nbytes:
                return ptr
            if ptr:
                hostmem.unmap(ptr, size)
        return hostmem.map_populated(nbytes, threads=self.populate_threads)

    def _premap(self, nbytes: int) -> None:
        """Fault the next slab in while this one is being registered."""
        if self._mapper is None:
            self._mapper = ThreadPoolExecutor(1, thread_name_prefix="cudask-pinned-map")
        self._premapped = self._mapper.submit(
            hostmem.map_populated, nbytes, threads=self.populate_threads
        )
        self._premapped_size = nbytes

    def _drop_premapped(self) -> None:
        future, self._premapped = self._premapped, None
        if future is not None:
            try:
                ptr = future.result()
            except hostmem.HostMemoryError:
                return
            hostmem.unmap(ptr, self._premapped_size)

    def _free_slab(self, slab: _Slab) -> None:
        assert self.backend is not None
        if slab.registered:
            self.backend.unregister_host(slab.ptr)
            hostmem.unmap(slab.ptr, slab.size)
        else:
            self.backend.free_pinned(slab.ptr)

    # -- fallback blocks -----------------------------------------------------------
    _REASONS: ClassVar[dict[str, str]] = {
        "full": "the pinned pool is full (memory.pinned-pool-size={capacity} bytes)",
        "available": "pinning more would pass cudask.memory.pinned-available-fraction of "
                     "the host memory available",
        "refused": "the driver refused to pin more host memory",
        "warmup": "pinned memory is still being made ready ({reserved} of {goal} bytes)",
    }
    _ADVICE: ClassVar[dict[str, str]] = {
        "full": "Raise cudask.memory.pinned-pool-size (e.g. "
                'dask.config.set({"cudask.memory.pinned-pool-size": "32GiB"})) to keep them pinned.',
        "available": "Free host memory, or raise cudask.memory.pinned-available-fraction.",
        "refused": "Lower cudask.memory.pinned-pool-size or free locked memory (ulimit -l).",
        "warmup": "Copies go to pinned memory as it becomes ready; set "
                  "cudask.memory.pinned-preallocate to pin some when the worker starts.",
    }

    def _fallback(self, nbytes: int, reason: str) -> HostBlock:
        """Host memory for one copy that no pinned range serves: counted, warned
        about once per cause, and (when large) registered later by the thread."""
        with self._lock:
            self.pageable_blocks += 1
            self.pageable_bytes += nbytes
            if reason == "warmup":
                self.warmup_fallback_bytes += nbytes
            warn = reason not in self._warned
            self._warned.add(reason)
            message = self._REASONS[reason].format(
                capacity=self.capacity, reserved=self.reserved, goal=self.goal
            )
        if warn and reason != "warmup":
            self._warn(
                f"cudask: {message}; device -> host copies use pageable memory meanwhile, "
                f"which is several times slower. {self._ADVICE[reason]} This warning is shown once."
            )
        elif warn:
            logger.info("cudask: %s; this copy goes to memory faulted in for it", message)
        if nbytes < MAPPED_FALLBACK_FROM:
            return HostBlock.pageable(nbytes)
        block = HostBlock.mapped(nbytes, threads=self.populate_threads)
        mapping = block._keepalive
        if isinstance(mapping, _Mapping) and self.method == "register" and reason != "refused":
            with self._lock:
                self._to_register.append(weakref.ref(mapping))
                self._wake.notify_all()
        return block

    def _register_fallback(self) -> bool:
        """Register one waiting fallback block's mapping, so copies back from it
        run at pinned speed; return whether there was one to try."""
        assert self.backend is not None
        with self._lock:
            mapping = None
            while self._to_register and mapping is None:
                mapping = self._to_register.popleft()()
            if mapping is None:
                return False
            if not self._fits(mapping.size):
                self._to_register.clear()
                return True
            self.registered_fallback += mapping.size
        started = time.perf_counter()
        try:
            self.backend.register_host(mapping.ptr, mapping.size)
        except Exception as exc:  # noqa: BLE001 - stays pageable, correct but slower
            with self._lock:
                self.registered_fallback -= mapping.size
                self._to_register.clear()
            logger.info("cudask: registering a fallback block failed: %s", exc)
            return True
        mapping.mark_registered(self.backend)
        with self._lock:
            self.upgraded_bytes += mapping.size
            self.upgrade_seconds += time.perf_counter() - started
            weakref.finalize(mapping, self._forget_fallback, mapping.size)
        return True

    def _forget_fallback(self, nbytes: int) -> None:
        with self._lock:
            self.registered_fallback -= nbytes

    def _warn_once(self, reason: str, message: str) -> None:
        with self._lock:
            if reason in self._warned:
                return
            self._warned.add(reason)
        self._warn(f"cudask: {message}")

    @staticmethod
    def _warn(message: str) -> None:
        logger.warning(message)
        warnings.warn(message, PinnedMemoryWarning, stacklevel=4)

    # -- the pool's thread ---------------------------------------------------------
    def _step(self) -> bool:
        """One step of the pool's thread: reserve a slab if below the goal,
        register a fallback block, or give back the slabs idle for
        `release_after`; return False when closed. Waits while there is
        nothing to do."""
        idle: list[_Slab] = []
        size = 0
        with self._lock:
            while True:
                if self._closed:
                    return False
                missing = min(self.goal, self.capacity) - self.reserved - self._reserving
                if ((missing >= self.alignment or self._big) and not self._pin_failed
                        and self._fits(min(max(missing, self.alignment), self.slab_size))):
                    size = min(self.slab_size, max(missing - missing % self.alignment, 0))
                    if self._big:
                        size, self._big = max(size, self._big), 0
                    break
                if self._to_register:
                    break
                idle, wait = self._idle_slabs()
                if idle:
                    break
                self._wake.wait(wait)
        if idle:
            self._give_back(idle)
            return True
        started = time.perf_counter()
        if size:
            self._grow(size, premap=self.duty_cycle >= 1)
        elif not self._register_fallback():
            return True
        self._rest((time.perf_counter() - started) * (1 / self.duty_cycle - 1))
        return True

    def _rest(self, seconds: float) -> None:
        """Let the other threads' CUDA calls through for `seconds` (until closed)."""
        if seconds <= 0:
            return
        started = time.monotonic()
        with self._lock:
            self._wake.wait_for(lambda: self._closed, seconds)
            self.rest_seconds += time.monotonic() - started

    def _idle_slabs(self) -> tuple[list[_Slab], float | None]:
        """Take out of the pool the slabs idle for `release_after`, newest first,
        keeping the start goal (all the free ones after `trim()`); also return how
        long until the next could go (None: until woken). Lock held."""
        trim, self._trim = self._trim, False
        if self.release_after is None and not trim:
            return [], None
        now = time.monotonic()
        reserved = sum(slab.size for slab in self._slabs)
        idle: list[_Slab] = []
        wait: float | None = None
        for slab in reversed(self._slabs):
            if slab.idle_since is None or reserved - slab.size < self.keep:
                continue
            due = 0.0 if trim or self.release_after is None else (
                slab.idle_since + self.release_after - now)
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

    def trim(self) -> None:
        """Give every wholly free slab beyond the start goal back to the operating
        system now, without waiting for `release_after` (host memory is short:
        the worker's memory manager is moving data to disk). Done by the pool's
        thread; returns at once."""
        with self._lock:
            if self._slabs and not self._closed:
                self._trim = True
                self._start_thread()
                self._wake.notify_all()

    def _give_back(self, slabs: list[_Slab]) -> None:
        """Return wholly free slabs, already out of the pool, to the driver."""
        for slab in slabs:
            self._free_slab(slab)
        nbytes = sum(slab.size for slab in slabs)
        with self._lock:
            self._releasing -= nbytes
            self.released_bytes += nbytes
        logger.debug("cudask: gave %d bytes of idle pinned memory back", nbytes)

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
        """Stop the thread, wait for pending copies and return every slab to the
        driver. Blocks still in use must not be touched afterwards."""
        with self._lock:
            self._closed = True
            self._wake.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=60)  # at most one slab being pinned
        self._drop_premapped()
        if self._mapper is not None:
            self._mapper.shutdown(wait=True)
        self._collect(wait=True)
        with self._lock:
            slabs, self._slabs = self._slabs, []
            self.in_use = 0
        for slab in slabs:
            self._free_slab(slab)

    def stats(self) -> dict[str, float]:
        """Pool state for the store's metrics: capacity, reserved and in-use bytes,
        readiness (1.0 when the goal is reserved), how fast memory was made ready
        (`pinned-provision-*`, and fallback blocks registered later:
        `pageable-registered-*`), pageable fallbacks (all causes; `-warmup-`
        those waiting for the thread) and bytes given back while idle."""
        with self._lock:
            reserved = self.reserved
            goal = min(self.goal, self.capacity)
            ready = 1.0 if goal <= 0 else min(reserved / goal, 1.0)
            rate = self.provisioned_bytes / self.provision_seconds if self.provision_seconds else 0.0
            return {
                "pinned-capacity-bytes": float(self.capacity),
                "pinned-reserved-bytes": float(reserved),
                "pinned-reserving-bytes": float(self._reserving),
                "pinned-goal-bytes": float(goal),
                "pinned-ready": ready,
                "pinned-in-use-bytes": float(self.in_use),
                "pinned-slabs": float(len(self._slabs)),
                "pinned-provision-bytes": float(self.provisioned_bytes),
                "pinned-provision-seconds": self.provision_seconds,
                "pinned-provision-gbps": rate / 1e9,
                "pinned-rest-seconds": self.rest_seconds,
                "pinned-registered": 1.0 if self.method == "register" else 0.0,
                "pinned-released-bytes": float(self.released_bytes),
                "pageable-fallback-count": float(self.pageable_blocks),
                "pageable-fallback-bytes": float(self.pageable_bytes),
                "pageable-fallback-warmup-bytes": float(self.warmup_fallback_bytes),
                "pageable-registered-bytes": float(self.upgraded_bytes),
                "pageable-registered-seconds": self.upgrade_seconds,
            }


def _pool_loop(pool: PinnedPool) -> None:
    """The pool's thread: reserve slabs as `goal` asks, register fallback
    blocks, give idle slabs back, until closed."""
    try:
        while pool._step():
            pass
    except Exception:  # never kill the worker over pinning
        logger.exception("cudask: the pinned-memory thread stopped")


__all__ = ["ALIGNMENT", "METHODS", "HostBlock", "PinnedMemoryWarning", "PinnedPool"]
