"""Copies between device and host memory on dedicated CUDA streams.

Covers: the `CopyBackend` protocol (the boundary to CUDA: host allocations
and registrations, streams, events, raw-pointer copies), its real implementation over
`cupy.cuda.runtime` (`CupyBackend`), and `TransferEngine`, which issues
device -> host copies into pinned host blocks on a non-blocking stream without
waiting for them, and host -> device copies on a second stream. Each copy is
ordered after the work that produced its source: before a device -> host copy
the copy stream waits on an event recorded on the legacy default stream (which
every blocking stream and the per-thread default streams synchronise with) and,
when the object's `__cuda_array_interface__` names another stream, on that
stream too. Each host -> device copy is ordered after the legacy default
stream as well, where the destination was allocated (a stream-ordered pool may
reuse memory that queued work still reads).

Does not cover: which objects live on the device or how they are rebuilt
(`cudask.memory.handlers`), how the pinned pool is carved (`cudask.memory.pinned`),
or when to spill (`cudask.memory.store`).

Threading: `TransferEngine` methods may be called from any thread; the
counters are guarded by a lock, the streams are only used to enqueue work. CuPy
is imported when `CupyBackend` is first instantiated, never at module import,
so importing this module creates no CUDA context.
"""

from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from cudask.memory.pinned import HostBlock, PinnedPool


@runtime_checkable
class CopyBackend(Protocol):
    """What the store needs from CUDA. Inject a fake one in tests
    (`cudask.testing.fake_cuda.FakeCopyBackend`)."""

    name: str

    def alloc_pinned(self, nbytes: int) -> int:
        """Allocate page-locked host memory; return its address. Raise MemoryError
        (or any exception) when the driver refuses."""

    def free_pinned(self, ptr: int) -> None:
        """Free memory from `alloc_pinned`."""

    def register_host(self, ptr: int, nbytes: int) -> None:
        """Page-lock existing host memory for copies from every context
        (cudaHostRegister); raise when the driver refuses."""

    def unregister_host(self, ptr: int) -> None:
        """Undo `register_host` (the memory itself stays the caller's)."""

    def new_stream(self) -> Any:
        """A new non-blocking stream for copies."""

    def record(self, stream: Any | None) -> Any:
        """Record an event on `stream` (None: the legacy default stream)."""

    def wait_event(self, stream: Any, event: Any) -> None:
        """Make `stream` wait for `event` (no host synchronisation)."""

    def external_stream(self, handle: int) -> Any:
        """A stream object for a raw handle named by `__cuda_array_interface__`."""

    def query(self, event: Any) -> bool:
        """Whether the work before `event` has completed (never blocks)."""

    def synchronize(self, event: Any) -> None:
        """Block the calling thread until `event` has completed."""

    def elapsed(self, start: Any, end: Any) -> float:
        """Seconds between two completed events."""

    def copy_d2h(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        """Enqueue a device -> host copy on `stream`."""

    def copy_h2d(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        """Enqueue a host -> device copy on `stream`."""

    def alloc_device(self, nbytes: int, device: int) -> tuple[int, Any]:
        """Allocate device memory for a rebuilt object of no known library type;
        return (address, owner keeping it alive)."""

    def wrap_device(self, owner: Any, ptr: int, interface: dict[str, Any]) -> Any:
        """Build the array object given back for a foreign `__cuda_array_interface__`
        object (a CuPy array on the real backend)."""

    def is_pinned(self, ptr: int) -> bool:
        """Whether host address `ptr` is page-locked (used by tests and metrics)."""


class CupyBackend:
    """`CopyBackend` over CuPy's runtime bindings (cudaHostAlloc, cudaMemcpyAsync,
    events). Needs CuPy; creates a CUDA context on first use."""

    name = "cupy"

    def __init__(self) -> None:
        import cupy

        self._cp = cupy
        self._rt = cupy.cuda.runtime

    def alloc_pinned(self, nbytes: int) -> int:
        # cudaHostAllocPortable: usable from every context in the process.
        return int(self._rt.hostAlloc(nbytes, 1))

    def free_pinned(self, ptr: int) -> None:
        self._rt.freeHost(ptr)

    def register_host(self, ptr: int, nbytes: int) -> None:
        # cudaHostRegisterPortable: usable from every context in the process.
        self._rt.hostRegister(ptr, nbytes, 1)

    def unregister_host(self, ptr: int) -> None:
        self._rt.hostUnregister(ptr)

    def new_stream(self) -> Any:
        return self._cp.cuda.Stream(non_blocking=True)

    def record(self, stream: Any | None) -> Any:
        event = self._cp.cuda.Event(block=False, disable_timing=False)
        event.record(self._cp.cuda.Stream.null if stream is None else stream)
        return event

    def wait_event(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def external_stream(self, handle: int) -> Any:
        return self._cp.cuda.ExternalStream(handle)

    def query(self, event: Any) -> bool:
        return bool(event.done)

    def synchronize(self, event: Any) -> None:
        event.synchronize()

    def elapsed(self, start: Any, end: Any) -> float:
        return float(self._cp.cuda.get_elapsed_time(start, end)) / 1000.0

    def copy_d2h(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        self._rt.memcpyAsync(dst, src, nbytes, self._rt.memcpyDeviceToHost, stream.ptr)

    def copy_h2d(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        self._rt.memcpyAsync(dst, src, nbytes, self._rt.memcpyHostToDevice, stream.ptr)

    def alloc_device(self, nbytes: int, device: int) -> tuple[int, Any]:
        with self._cp.cuda.Device(device):
            memptr = self._cp.cuda.alloc(max(nbytes, 1))
        return int(memptr.ptr), memptr

    def wrap_device(self, owner: Any, ptr: int, interface: dict[str, Any]) -> Any:
        import numpy

        memptr = owner + (ptr - int(owner.ptr))
        return self._cp.ndarray(
            tuple(interface["shape"]),
            dtype=numpy.dtype(interface["typestr"]),
            memptr=memptr,
            strides=interface.get("strides"),
        )

    def is_pinned(self, ptr: int) -> bool:
        try:
            attrs = self._rt.pointerGetAttributes(ptr)
        except Exception:  # noqa: BLE001 - not a CUDA-known address
            return False
        return int(attrs.type) == 1  # cudaMemoryTypeHost


def default_backend() -> CopyBackend:
    """The real backend (CuPy). Raises MissingDependencyError without CuPy."""
    from cudask.errors import require

    require("cupy", needed_for="spilling device memory", install="pip install 'cudask[cuda]'")
    return CupyBackend()


@dataclass
class Copy:
    """One enqueued copy: `done` is recorded after it on its stream. `source`, when
    set, is a device object the copy reads that nothing else keeps alive: it is
    held until the copy is seen complete."""

    nbytes: int
    start: Any
    done: Any
    backend: CopyBackend
    wall_start: float = field(default_factory=time.perf_counter)
    source: Any = None

    def ready(self) -> bool:
        done = self.backend.query(self.done)
        if done:
            self.source = None
        return done

    def wait(self) -> None:
        self.backend.synchronize(self.done)
        self.source = None


class TransferEngine:
    """Issue copies between device memory and host blocks of a `PinnedPool`.

    `to_host` allocates a host block from the pool (pinned, or pageable when the
    pool is exhausted), enqueues the copy on the device -> host stream and returns
    at once with a `Copy` whose event the caller keeps; the source must stay
    alive until `Copy.ready()` (the store keeps it in its in-flight list).
    `to_device` enqueues a host -> device copy on the other stream.
    """

    def __init__(self, backend: CopyBackend, pool: PinnedPool) -> None:
        self.backend = backend
        self.pool = pool
        self._lock = threading.Lock()
        self._streams: dict[str, Any] = {}

    def _stream(self, which: str) -> Any:
        stream = self._streams.get(which)
        if stream is None:
            with self._lock:
                stream = self._streams.get(which)
                if stream is None:
                    stream = self._streams[which] = self.backend.new_stream()
        return stream

    def order_after_producers(self, producer_streams: tuple[int, ...] = ()) -> None:
        """Make the device -> host stream wait for work already enqueued on the
        legacy default stream and on the given raw stream handles."""
        stream = self._stream("d2h")
        self.backend.wait_event(stream, self.backend.record(None))
        for handle in producer_streams:
            if handle in (0, 1, 2):  # legacy / per-thread defaults: covered above
                continue
            self.backend.wait_event(stream, self.backend.record(self.backend.external_stream(handle)))

    def to_host(self, src: int, nbytes: int) -> tuple[HostBlock, Copy]:
        """Copy `nbytes` at device address `src` into a new host block (async)."""
        block = self.pool.allocate(nbytes)
        stream = self._stream("d2h")
        start = self.backend.record(stream)
        if nbytes:
            self.backend.copy_d2h(block.ptr, src, nbytes, stream)
        done = self.backend.record(stream)
        return block, Copy(nbytes, start, done, self.backend)

    def to_device(self, dst: int, src_host: int, nbytes: int, after: Copy | None = None) -> Copy:
        """Copy `nbytes` from host address `src_host` to device address `dst`
        (async; ordered after `after`, the copy that filled the host block)."""
        stream = self._stream("h2d")
        # `dst` was just allocated, on the legacy default stream for CuPy and RMM:
        # stream-ordered pools may hand out memory that work queued there still
        # reads, so the copy must not overtake that work.
        self.backend.wait_event(stream, self.backend.record(None))
        if after is not None and not after.ready():
            self.backend.wait_event(stream, after.done)
        start = self.backend.record(stream)
        if nbytes:
            self.backend.copy_h2d(dst, src_host, nbytes, stream)
        done = self.backend.record(stream)
        return Copy(nbytes, start, done, self.backend)

    def stream_seconds(self, copy: Copy) -> float:
        """Seconds a completed copy took on its stream, between its own events:
        what the bus took, without the wait for producers or for copies queued
        before it (wall time since it was enqueued where events carry no timing)."""
        try:
            return self.backend.elapsed(copy.start, copy.done)
        except Exception:  # noqa: BLE001 - events without timing
            return time.perf_counter() - copy.wall_start


def address_of(buffer: Any) -> int:
    """Address of a writable or read-only host buffer (bytes, bytearray, memoryview,
    numpy array)."""
    import numpy

    view = memoryview(buffer)
    if view.nbytes == 0:
        return 0
    return int(numpy.frombuffer(view.cast("B") if view.ndim != 1 or view.format != "B" else view,
                                dtype=numpy.uint8).ctypes.data)


def memoryview_at(ptr: int, nbytes: int) -> memoryview:
    """A writable memoryview of `nbytes` of host memory at `ptr` (no copy)."""
    return memoryview((ctypes.c_uint8 * nbytes).from_address(ptr)).cast("B")


__all__ = [
    "Copy",
    "CopyBackend",
    "CupyBackend",
    "TransferEngine",
    "address_of",
    "default_backend",
    "memoryview_at",
]
