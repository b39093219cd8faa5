"""The boundary to CUDA: what the memory core asks of the driver, and nothing more.

Covers: the `CopyBackend` protocol (host allocations and registrations,
streams, events, raw-pointer copies, device allocations for rebuilt objects,
free device memory),
its implementation over `cupy.cuda.runtime` (`CupyBackend`, `default_backend`),
`Copy` (one enqueued copy and its completion event), `is_out_of_memory` (the
one test of whether an exception means "out of memory", host or device), and
raw host-memory helpers (`address_of`, `memoryview_at`).

Does not cover: host memory and its pinned pool (`cudask.memory.host`),
issuing copies on streams (`cudask.memory.host.copy_engine`), which objects live
on the device (the handlers), or when to spill (the store).

Threading: every function is thread-safe; a backend only enqueues work on the
streams it is given. CuPy is imported when `CupyBackend` is first
instantiated, never at module import, so importing this module creates no
CUDA context. Tests inject `cudask.testing.fake_cuda.FakeCopyBackend`.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


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

    def wait_event(self, stream: Any | None, event: Any) -> None:
        """Make `stream` (None: the legacy default stream) wait for `event` (no host
        synchronisation)."""

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

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes of the current device's memory, as the driver
        reports them (cudaMemGetInfo)."""


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

    def wait_event(self, stream: Any | None, event: Any) -> None:
        (self._cp.cuda.Stream.null if stream is None else stream).wait_event(event)

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

    def mem_get_info(self) -> tuple[int, int]:
        free, total = self._rt.memGetInfo()
        return int(free), int(total)

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
    set, is what the copy reads (a device object, or the host copy it brings
    back), held until the copy is seen complete so that its memory cannot be
    freed or reused under the copy."""

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


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` says that host or device memory ran out: a MemoryError,
    CuPy's OutOfMemoryError, or a CUDA error such as cudaErrorMemoryAllocation."""
    text = str(exc).lower()
    return (
        isinstance(exc, MemoryError)
        or "OutOfMemory" in type(exc).__name__
        or "out of memory" in text
        or "memoryallocation" in text
    )


def address_of(buffer: Any) -> int:
    """Address of a writable or read-only host buffer (bytes, bytearray, memoryview,
    numpy array)."""
    import numpy

    view = memoryview(buffer)
    if view.nbytes == 0:
        return 0
    return int(
        numpy.frombuffer(
            view.cast("B") if view.ndim != 1 or view.format != "B" else view, dtype=numpy.uint8
        ).ctypes.data
    )


def memoryview_at(ptr: int, nbytes: int) -> memoryview:
    """A writable memoryview of `nbytes` of host memory at `ptr` (no copy)."""
    return memoryview((ctypes.c_uint8 * nbytes).from_address(ptr)).cast("B")


__all__ = [
    "Copy",
    "CopyBackend",
    "CupyBackend",
    "address_of",
    "default_backend",
    "is_out_of_memory",
    "memoryview_at",
]
