"""Fake `cupy` and `rmm` modules, shaped as spill on demand uses them, for CPU tests.

Covers: `FakeDevice`, a GPU of `capacity` bytes whose memory is what tasks
allocated, plus what a store holds (`held`, e.g. its `device_bytes`), plus
blocks a pool caches; `cupy_module(device)`, a module whose default memory
pool allocates from the device and caches freed blocks (`total_bytes`,
`free_all_blocks`, `OutOfMemoryError`, `get_allocator`/`set_allocator`);
`rmm_module(device)`, a module whose `rmm.mr` has the resources and adaptors
`cudask.memory.allocators` composes (limiting, binning, callback, failure
callback), routing allocations as RMM does. Install them with
`monkeypatch.setitem(sys.modules, "cupy", ...)`.

Does not cover: device memory contents (allocations are numbers), streams.

Threading: not thread-safe; a test drives it from one thread.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any


class OutOfMemoryError(MemoryError):
    """The fake CuPy's (and RMM's) out-of-memory error."""


class FakeDevice:
    """`capacity` bytes: allocations (`allocated`), the store's (`held()`) and
    blocks cached by the fake CuPy pool (`cached`)."""

    def __init__(self, capacity: int, held: Callable[[], int] = lambda: 0) -> None:
        self.capacity = capacity
        self.held = held
        self.allocated = 0
        self.cached = 0
        self.mallocs: list[int] = []

    def used(self) -> int:
        return self.held() + self.allocated + self.cached

    def mem_get_info(self) -> tuple[int, int]:
        return max(self.capacity - self.used(), 0), self.capacity

    def take(self, nbytes: int) -> int:
        if self.used() + nbytes > self.capacity:
            raise OutOfMemoryError(f"Out of memory allocating {nbytes:,} bytes")
        self.allocated += nbytes
        self.mallocs.append(nbytes)
        return nbytes

    def free(self, nbytes: int) -> None:
        self.allocated -= nbytes


class FakePool:
    """CuPy's default memory pool: freed blocks stay cached until `free_all_blocks`
    (or until an allocation would fail without them, as CuPy does)."""

    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        self.total_calls = 0

    def malloc(self, nbytes: int) -> int:
        device = self.device
        if device.cached >= nbytes:
            device.cached -= nbytes
            device.allocated += nbytes
            return nbytes
        try:
            return device.take(nbytes)
        except OutOfMemoryError:
            device.cached = 0
            return device.take(nbytes)

    def free(self, nbytes: int) -> None:
        """A pool allocation died: its block stays cached."""
        self.device.allocated -= nbytes
        self.device.cached += nbytes

    def total_bytes(self) -> int:
        self.total_calls += 1
        return self.device.allocated + self.device.cached + self.device.held()

    def free_bytes(self) -> int:
        return self.device.cached

    def free_all_blocks(self) -> None:
        self.device.cached = 0


def cupy_module(device: FakeDevice) -> types.ModuleType:
    """A `cupy` module whose allocator is its default pool's `malloc`."""
    pool = FakePool(device)
    state: dict[str, Any] = {"allocator": pool.malloc}
    cupy = types.ModuleType("cupy")
    cupy.get_default_memory_pool = lambda: pool  # type: ignore[attr-defined]
    cupy.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        get_allocator=lambda: state["allocator"],
        set_allocator=lambda a: state.__setitem__("allocator", a),
        memory=types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError),
    )
    cupy.pool = pool  # type: ignore[attr-defined]
    return cupy


class Resource:
    """A device memory resource: `allocate(nbytes, stream)` -> pointer (here: nbytes)."""

    def __init__(self, device: FakeDevice) -> None:
        self.device = device

    def allocate(self, nbytes: int, stream: Any = None) -> int:
        return self.device.take(nbytes)

    def deallocate(self, ptr: int, nbytes: int, stream: Any = None) -> None:
        self.device.free(nbytes)


class Limiting:
    def __init__(self, upstream: Any, allocation_limit: int) -> None:
        self.upstream, self.limit, self.allocated = upstream, allocation_limit, 0

    def allocate(self, nbytes: int, stream: Any = None) -> int:
        if self.allocated + nbytes > self.limit:
            raise OutOfMemoryError(f"limit of {self.limit} bytes reached")
        ptr = self.upstream.allocate(nbytes, stream)
        self.allocated += nbytes
        return int(ptr)

    def deallocate(self, ptr: int, nbytes: int, stream: Any = None) -> None:
        self.upstream.deallocate(ptr, nbytes, stream)
        self.allocated -= nbytes

    def get_allocated_bytes(self) -> int:
        return self.allocated


class Callback:
    def __init__(
        self, allocate: Callable[[int, Any], int], deallocate: Callable[[int, int, Any], None]
    ) -> None:
        self._allocate, self._deallocate = allocate, deallocate
        self.calls = 0

    def allocate(self, nbytes: int, stream: Any = None) -> int:
        self.calls += 1
        return self._allocate(nbytes, stream)

    def deallocate(self, ptr: int, nbytes: int, stream: Any = None) -> None:
        self._deallocate(ptr, nbytes, stream)


class Binning:
    """Allocations up to a bin's size go to that bin's resource, larger ones upstream."""

    def __init__(self, upstream: Any) -> None:
        self.upstream = upstream
        self.bins: dict[int, Any] = {}

    def add_bin(self, allocation_size: int, bin_resource: Any = None) -> None:
        self.bins[allocation_size] = bin_resource

    def _route(self, nbytes: int) -> Any:
        sizes = [size for size in sorted(self.bins) if size >= nbytes]
        return self.bins[sizes[0]] if sizes else self.upstream

    def allocate(self, nbytes: int, stream: Any = None) -> int:
        return int(self._route(nbytes).allocate(nbytes, stream))

    def deallocate(self, ptr: int, nbytes: int, stream: Any = None) -> None:
        self._route(nbytes).deallocate(ptr, nbytes, stream)


class FailureCallback:
    def __init__(self, upstream: Any, callback: Callable[[int], bool]) -> None:
        self.upstream, self.callback = upstream, callback

    def allocate(self, nbytes: int, stream: Any = None) -> int:
        while True:
            try:
                return int(self.upstream.allocate(nbytes, stream))
            except MemoryError:
                if not self.callback(nbytes):
                    raise

    def deallocate(self, ptr: int, nbytes: int, stream: Any = None) -> None:
        self.upstream.deallocate(ptr, nbytes, stream)


def rmm_module(device: FakeDevice) -> types.ModuleType:
    """An `rmm` module whose current resource allocates from `device`."""
    state: dict[str, Any] = {"resource": Resource(device)}
    rmm = types.ModuleType("rmm")
    rmm.mr = types.SimpleNamespace(  # type: ignore[attr-defined]
        get_current_device_resource=lambda: state["resource"],
        set_current_device_resource=lambda r: state.__setitem__("resource", r),
        LimitingResourceAdaptor=Limiting,
        BinningMemoryResource=Binning,
        CallbackMemoryResource=Callback,
        FailureCallbackResourceAdaptor=FailureCallback,
    )
    return rmm


__all__ = ["FakeDevice", "FakePool", "OutOfMemoryError", "cupy_module", "rmm_module"]
