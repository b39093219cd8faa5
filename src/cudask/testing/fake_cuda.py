"""Fake device objects and a fake copy backend, so the store runs on a CPU.

Covers:

- `FakeDeviceArray`: an array whose "device memory" is host memory, exposed
  through `__cuda_array_interface__` like a CuPy array. Views share their
  root allocation (`view`, `T`, slicing), so aliasing can be tested; a handler
  registered for it counts the whole root allocation, compacts sparse views
  (as CuPy's handler does on a GPU) and rebuilds the same type.
- `ForeignDeviceObject`: a bare object exposing only `__cuda_array_interface__`
  (the generic path, rebuilt by the backend as a `FakeDeviceArray`).
- `FakeCopyBackend`: a `cudask.memory.backend.CopyBackend` whose streams
  queue copies and run them later (optionally only when an event is
  synchronised, to exercise the in-flight paths), whose pinned memory is
  ordinary memory with a configurable refusal limit, and which records what
  happened (copies, pinned allocations) for assertions.

- `FakeIPCBackend`: the CUDA calls of cudask.comm.ipc within one process;
  `FakeUpstream`, an RMM resource's calls for a recorded pool's slabs.

Tests inject `FakeCopyBackend` into `TieredStore(backend=...)`; runtime code
never looks for it. Does not cover: NVML/device discovery fakes
(`cudask.testing.devices`).
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy

from cudask.memory.handlers import CudaArrayInterfaceHandler, register_handler
from cudask.memory.host.copy_engine import TransferEngine


class FakeDeviceArray:
    """A numpy array standing for device memory. `root` is the array owning the
    allocation (itself for a fresh array)."""

    __slots__ = ("__weakref__", "_array", "_root")

    def __init__(self, array: numpy.ndarray, root: FakeDeviceArray | None = None) -> None:
        self._array = array
        self._root = root  # None: this array owns its allocation (no self-reference cycle)

    # -- construction ----------------------------------------------------------
    @classmethod
    def from_numpy(cls, array: numpy.ndarray) -> FakeDeviceArray:
        """A new allocation holding a copy of `array`."""
        return cls(numpy.array(array, copy=True, order="C"))

    @classmethod
    def empty(cls, shape: int | tuple[int, ...], dtype: Any = "u1") -> FakeDeviceArray:
        return cls(numpy.empty(shape, dtype=dtype))

    def view(self, index: Any = Ellipsis) -> FakeDeviceArray:
        """A view sharing this array's allocation (e.g. `a.view(slice(2, 10, 3))`)."""
        return FakeDeviceArray(self._array[index], self.root)

    def __getitem__(self, index: Any) -> FakeDeviceArray:
        return self.view(index)

    @property
    def T(self) -> FakeDeviceArray:
        return FakeDeviceArray(self._array.T, self.root)

    # -- inspection ------------------------------------------------------------
    def get(self) -> numpy.ndarray:
        """A host copy (like cupy.ndarray.get())."""
        return self._array.copy()

    @property
    def shape(self) -> tuple[int, ...]:
        return self._array.shape

    @property
    def dtype(self) -> numpy.dtype[Any]:
        return self._array.dtype

    @property
    def strides(self) -> tuple[int, ...]:
        return self._array.strides

    @property
    def nbytes(self) -> int:
        return int(self._array.nbytes)

    @property
    def root(self) -> FakeDeviceArray:
        return self if self._root is None else self._root

    @property
    def allocation(self) -> tuple[int, int]:
        """(address, size) of the root allocation."""
        root = self.root._array
        return int(root.ctypes.data), int(root.nbytes)

    def fill(self, value: Any) -> None:
        self._array[...] = value

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        a = self._array
        return {
            "shape": a.shape,
            "typestr": a.dtype.str,
            "data": (int(a.ctypes.data), False),
            "strides": None if a.flags.c_contiguous else a.strides,
            "version": 3,
        }

    def __repr__(self) -> str:
        return f"FakeDeviceArray(shape={self.shape}, dtype={self.dtype})"


class ForeignDeviceObject:
    """Exposes only `__cuda_array_interface__` over a FakeDeviceArray."""

    def __init__(self, array: FakeDeviceArray) -> None:
        self.array = array
        self.__cuda_array_interface__ = array.__cuda_array_interface__


class FakeHandler(CudaArrayInterfaceHandler):
    """FakeDeviceArray: counts its root allocation, rebuilds a FakeDeviceArray."""

    name = "fake"

    def accepts(self, obj: Any) -> bool:
        return True

    def allocations(self, obj: Any) -> list[tuple[int, int]]:
        ptr, size = obj.allocation
        return [(ptr, ptr + size)] if size else []

    def compact(self, obj: Any) -> tuple[Any, tuple[int, ...]] | None:
        return FakeDeviceArray.from_numpy(obj._array), ()

    def rebuild(self, owner: Any, ptr: int, meta: dict[str, Any], engine: TransferEngine) -> Any:
        return engine.backend.wrap_device(owner, ptr, self.interface_of(meta, ptr))


register_handler(FakeDeviceArray, FakeHandler())


# ----------------------------------------------------------------------------------
# Backend
# ----------------------------------------------------------------------------------
@dataclass
class FakeEvent:
    stream: FakeStream
    index: int
    completed_at: float | None = None


@dataclass
class FakeStream:
    name: str
    ops: deque[tuple[Any, ...]] = field(default_factory=deque)
    enqueued: int = 0
    done: int = 0
    recorded: deque[FakeEvent] = field(default_factory=deque)  # not yet completed


class FakeCopyBackend:
    """`CopyBackend` over host memory.

    lag: 0 runs every copy when it is enqueued; n > 0 leaves copies queued and
    advances a stream by one operation per `query` after the first n queries of
    an event, and fully on `synchronize` - so copies are observably in flight.
    pin_limit: bytes of pinned memory the "driver" grants before refusing
    (allocated and registered alike).
    refuse_register: cause given when `register_host` is called (None: it works).
    clock: what stamps a completed event (seconds; `elapsed` subtracts two
    stamps); a test's own clock makes a copy's stream time exact.
    device_memory: `mem_get_info`'s (free, total), or a callable giving them
    (default: 1 TiB, all free).
    """

    name = "fake"

    def __init__(
        self,
        *,
        lag: int = 0,
        pin_limit: int | None = None,
        refuse_register: str | None = None,
        clock: Callable[[], float] = time.perf_counter,
        device_memory: tuple[int, int] | Callable[[], tuple[int, int]] = (1 << 40, 1 << 40),
    ) -> None:
        self.device_memory = device_memory
        self.lag = lag
        self.clock = clock
        self.pin_limit = pin_limit
        self.refuse_register = refuse_register
        self.registered: dict[int, int] = {}  # address -> bytes
        self.register_calls = 0
        self.lock = threading.RLock()
        self.pinned: dict[int, numpy.ndarray] = {}
        self.device: dict[int, numpy.ndarray] = {}
        self.pinned_bytes = 0
        self.pin_calls = 0
        self.pin_refusals = 0
        self.copies: list[tuple[str, int]] = []  # (direction, nbytes)
        self.null = FakeStream("null")
        self.streams: list[FakeStream] = [self.null]
        self._names = itertools.count()
        self._queries: dict[int, int] = {}

    # -- host memory -----------------------------------------------------------
    def alloc_pinned(self, nbytes: int) -> int:
        with self.lock:
            self.pin_calls += 1
            if self.pin_limit is not None and self.pinned_bytes + nbytes > self.pin_limit:
                self.pin_refusals += 1
                raise MemoryError(f"fake cudaHostAlloc refused {nbytes} bytes")
            buf = numpy.zeros(nbytes, dtype=numpy.uint8)
            ptr = int(buf.ctypes.data)
            self.pinned[ptr] = buf
            self.pinned_bytes += nbytes
            return ptr

    def free_pinned(self, ptr: int) -> None:
        with self.lock:
            buf = self.pinned.pop(ptr)
            self.pinned_bytes -= buf.nbytes

    def register_host(self, ptr: int, nbytes: int) -> None:
        with self.lock:
            self.register_calls += 1
            if self.refuse_register is not None:
                raise RuntimeError(self.refuse_register)
            if self.pin_limit is not None and self.pinned_bytes + nbytes > self.pin_limit:
                self.pin_refusals += 1
                raise MemoryError(f"fake cudaHostRegister refused {nbytes} bytes")
            if ptr in self.registered:
                raise RuntimeError(f"fake cudaHostRegister: {ptr:#x} is already registered")
            self.registered[ptr] = nbytes
            self.pinned_bytes += nbytes

    def unregister_host(self, ptr: int) -> None:
        with self.lock:
            self.pinned_bytes -= self.registered.pop(ptr)

    def is_pinned(self, ptr: int) -> bool:
        with self.lock:
            return any(p <= ptr < p + b.nbytes for p, b in self.pinned.items()) or any(
                p <= ptr < p + n for p, n in self.registered.items()
            )

    # -- device memory ---------------------------------------------------------
    def mem_get_info(self) -> tuple[int, int]:
        memory = self.device_memory
        return memory() if callable(memory) else memory

    def alloc_device(self, nbytes: int, device: int) -> tuple[int, Any]:
        buf = numpy.empty(max(nbytes, 1), dtype=numpy.uint8)
        return int(buf.ctypes.data), buf

    def wrap_device(self, owner: Any, ptr: int, interface: dict[str, Any]) -> Any:
        base = int(owner.ctypes.data)
        dtype = numpy.dtype(
            interface.get("descr")
            and [tuple(d) for d in interface["descr"]]
            or interface["typestr"]
        )
        array = numpy.ndarray(
            tuple(interface["shape"]),
            dtype=dtype,
            buffer=owner,
            offset=ptr - base,
            strides=interface.get("strides"),
        )
        return FakeDeviceArray(array, FakeDeviceArray(owner))

    # -- streams and events ----------------------------------------------------
    def new_stream(self) -> FakeStream:
        stream = FakeStream(f"s{next(self._names)}")
        with self.lock:
            self.streams.append(stream)
        return stream

    def external_stream(self, handle: int) -> FakeStream:
        return self.null

    def record(self, stream: Any | None) -> FakeEvent:
        stream = self.null if stream is None else stream
        with self.lock:
            event = FakeEvent(stream, stream.enqueued)
            if stream.done >= event.index:
                event.completed_at = self.clock()
            else:
                stream.recorded.append(event)
            return event

    def wait_event(self, stream: Any | None, event: Any) -> None:
        self._enqueue(self.null if stream is None else stream, ("wait", event))

    def query(self, event: Any) -> bool:
        with self.lock:
            if event.stream.done >= event.index:
                return True
            seen = self._queries.get(id(event), 0) + 1
            self._queries[id(event)] = seen
            if seen > self.lag:
                self._advance(event.stream, event.stream.done + 1)
            done = event.stream.done >= event.index
            if done:
                self._queries.pop(id(event), None)
            return done

    def synchronize(self, event: Any) -> None:
        with self.lock:
            self._advance(event.stream, event.index)
            self._queries.pop(id(event), None)

    def elapsed(self, start: Any, end: Any) -> float:
        if start.completed_at is None or end.completed_at is None:
            raise RuntimeError("event not completed")
        return max(end.completed_at - start.completed_at, 0.0)

    # -- copies ----------------------------------------------------------------
    def copy_d2h(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        self._enqueue(stream, ("copy", "d2h", dst, src, nbytes))

    def copy_h2d(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        self._enqueue(stream, ("copy", "h2d", dst, src, nbytes))

    def _enqueue(self, stream: FakeStream, op: tuple[Any, ...]) -> None:
        with self.lock:
            stream.ops.append(op)
            stream.enqueued += 1
            if self.lag == 0:
                self._advance(stream, stream.enqueued)

    def _advance(self, stream: FakeStream, upto: int) -> None:
        while stream.done < upto and stream.ops:
            op = stream.ops.popleft()
            if op[0] == "wait":
                self._advance(op[1].stream, op[1].index)
            else:
                _, direction, dst, src, nbytes = op
                ctypes.memmove(dst, src, nbytes)
                self.copies.append((direction, nbytes))
            stream.done += 1
            now = self.clock()
            while stream.recorded and stream.recorded[0].index <= stream.done:
                stream.recorded.popleft().completed_at = now

    def drain(self) -> None:
        """Run everything still queued on every stream."""
        with self.lock:
            for stream in self.streams:
                self._advance(stream, stream.enqueued)

    def in_flight(self) -> int:
        """Operations queued and not yet run."""
        with self.lock:
            return sum(len(stream.ops) for stream in self.streams)


def filled(n: int, fill: float = 0, dtype: str = "u1") -> FakeDeviceArray:
    """A fake device array of `n` elements, each `fill`."""
    a = FakeDeviceArray.empty(n, dtype)
    a.fill(fill)
    return a


def as_numpy(value: Any) -> Any:
    """Host image of a (possibly nested) fake device value, for comparisons."""
    if isinstance(value, FakeDeviceArray):
        return value.get()
    if isinstance(value, ForeignDeviceObject):
        return value.array.get()
    if type(value) in (list, tuple):
        return type(value)(as_numpy(v) for v in value)
    if type(value) is dict:
        return {k: as_numpy(v) for k, v in value.items()}
    return value


class FakeIPCBackend:
    """A `cudask.comm.ipc_cuda.Backend` for one process: allocations are NumPy
    buffers behind FakeDeviceArrays, named by a handle; `open` gives their
    address, copies are real memmoves; it records what was opened, closed and
    waited for."""

    def __init__(self) -> None:
        self.allocations: dict[bytes, numpy.ndarray] = {}
        self.opened: list[bytes] = []
        self.closed: list[int] = []
        self.readied = 0

    def allocate(self, host: numpy.ndarray) -> FakeDeviceArray:
        self.allocations[f"h{len(self.allocations)}".encode()] = host
        return FakeDeviceArray(host)

    def ready(self) -> None:
        self.readied += 1

    def export(self, ptr: int) -> tuple[bytes, int]:
        for handle, host in self.allocations.items():
            base = host.ctypes.data
            if base <= ptr < base + host.nbytes:
                return handle, ptr - base
        raise RuntimeError("cudaErrorInvalidValue: not exportable")

    def open(self, handle: bytes) -> int:
        self.opened.append(handle)
        return int(self.allocations[handle].ctypes.data)

    def close(self, base: int) -> None:
        self.closed.append(base)

    def empty(self, shape: tuple[int, ...], dtype: str, order: str) -> FakeDeviceArray:
        return FakeDeviceArray(
            numpy.empty(shape, dtype=numpy.dtype(dtype), order="F" if order == "F" else "C")
        )

    def allocate_area(self, nbytes: int) -> int:
        """A staging area (cudask.comm.staging), exported as handle b"staging"."""
        self.allocations[b"staging"] = numpy.zeros(nbytes, dtype="u1")
        return int(self.allocations[b"staging"].ctypes.data)

    def free_area(self, base: int) -> None:
        """Free the staging area at `base`."""
        area = self.allocations.get(b"staging")
        if area is None or area.ctypes.data != base:
            raise RuntimeError("cudaErrorInvalidValue: not an area")
        del self.allocations[b"staging"]

    def stage(self, x: FakeDeviceArray, address: int, order: str) -> None:
        source = x._array
        memory = (ctypes.c_char * source.nbytes).from_address(address)
        numpy.ndarray(
            source.shape, source.dtype, memoryview(memory), order="F" if order == "F" else "C"
        )[...] = source

    def copy(self, out: FakeDeviceArray, src: int, strides: tuple[int, ...]) -> None:
        from cudask.comm.ipc_layout import extent

        target = out._array
        low, span = extent(src, target.shape, strides, target.itemsize)
        memory = (ctypes.c_char * span).from_address(low)
        target[...] = numpy.ndarray(
            target.shape, target.dtype, memoryview(memory), src - low, strides
        )


class FakeUpstream:
    """An RMM resource's allocate and deallocate over NumPy buffers (the upstream
    of a recorded pool, cudask.comm.lifetimes.Slabs); `buffers` by address."""

    def __init__(self) -> None:
        self.buffers: dict[int, numpy.ndarray] = {}

    def allocate(self, nbytes: int, stream: Any) -> int:
        buf = numpy.zeros(nbytes, dtype="u1")
        self.buffers[buf.ctypes.data] = buf
        return int(buf.ctypes.data)

    def deallocate(self, ptr: int, nbytes: int, stream: Any) -> None:
        assert self.buffers.pop(ptr).nbytes == nbytes


__all__ = [
    "FakeCopyBackend",
    "FakeDeviceArray",
    "FakeHandler",
    "FakeIPCBackend",
    "FakeUpstream",
    "ForeignDeviceObject",
    "as_numpy",
    "filled",
]
