"""Handlers built on `__cuda_array_interface__`, and the geometry it describes.

Covers: the bytes (`interface_nbytes`), the extent for any strides
(`interface_extent`) and the producer stream (`interface_stream`) of an
interface; `CudaArrayInterfaceHandler`, for objects no registered handler
claims, copying the extent so strided views keep their strides, and copying a
sparse view (elements filling at most half its extent) through a C-contiguous
device copy where a subclass can make one; the subclasses that override its
hooks (`interface`, `device_of`, `meta`, `compact`, `allocate`, `rebuild`):
`CupyHandler` and `NumbaHandler`, each with its lazy `register`.

Does not cover: masked interfaces (`UnspillableError`), choosing a handler
(`registry`), CuPy as the copy backend (`cudask.memory.backend`).

Threading: stateless; any thread. Copies complete later (see `HostCopy`).
CuPy and Numba are imported only inside the methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy

from cudask.memory.accounting import Range
from cudask.memory.handlers.images import HostCopy
from cudask.memory.handlers.registry import UnspillableError, register_handler

if TYPE_CHECKING:
    from cudask.memory.backend import Copy
    from cudask.memory.host.copy_engine import TransferEngine


def interface_nbytes(cai: dict[str, Any]) -> int:
    """Bytes of the elements a `__cuda_array_interface__` describes."""
    itemsize = numpy.dtype(cai["typestr"]).itemsize
    return itemsize * int(numpy.prod([int(n) for n in cai["shape"]], dtype=numpy.int64))


def interface_extent(cai: dict[str, Any]) -> tuple[int, int, int]:
    """(lowest address, end address, offset of element 0 from the lowest address)
    of the memory a `__cuda_array_interface__` describes."""
    ptr = int(cai["data"][0] or 0)
    shape = tuple(int(n) for n in cai["shape"])
    strides = cai.get("strides")
    if any(n == 0 for n in shape):
        return ptr, ptr, 0
    if strides is None:
        return ptr, ptr + interface_nbytes(cai), 0
    itemsize = numpy.dtype(cai["typestr"]).itemsize
    low = sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
    high = sum((n - 1) * s for n, s in zip(shape, strides) if s > 0)
    return ptr + low, ptr + high + itemsize, -low


def interface_stream(cai: dict[str, Any]) -> tuple[int, ...]:
    """The raw stream handle the interface says its data is written on, if any."""
    stream = cai.get("stream")
    return (int(stream),) if stream else ()


class CudaArrayInterfaceHandler:
    """Any object exposing `__cuda_array_interface__` (v2/v3, without mask).

    The copy covers the object's extent (from its lowest to its highest byte, so
    strided views keep their strides); it is rebuilt by `rebuild`, by default the
    backend's array type (CuPy on a real GPU), since a foreign type cannot be
    reconstructed in general. Subclasses override `allocate`/`rebuild` to keep
    their type.

    A sparse view, whose elements fill at most half of its extent (a column of a
    C-ordered chunk, `x[::3, ::2]`), is copied through a C-contiguous device copy
    when the subclass can make one (`compact`): the copies then move its elements,
    not its extent, and unspilling allocates only them. It comes back
    C-contiguous, with the same shape, dtype and values.
    """

    name = "cuda_array_interface"

    def accepts(self, obj: Any) -> bool:
        try:
            _ = obj.__cuda_array_interface__
        except Exception:  # noqa: BLE001 - e.g. a CPU torch tensor raises here
            return False
        return True

    def interface(self, obj: Any) -> dict[str, Any]:
        cai = dict(obj.__cuda_array_interface__)
        if cai.get("mask") is not None:
            raise UnspillableError(
                f"{type(obj).__name__}: masked __cuda_array_interface__ objects cannot be spilled"
            )
        return cai

    def allocations(self, obj: Any) -> list[Range]:
        low, high, _ = interface_extent(obj.__cuda_array_interface__)
        return [(low, high)] if high > low else []

    def producer_streams(self, obj: Any) -> tuple[int, ...]:
        return interface_stream(obj.__cuda_array_interface__)

    def device_of(self, obj: Any) -> int:
        return 0

    def meta(self, obj: Any) -> dict[str, Any]:
        return {}

    def compact(self, obj: Any) -> tuple[Any, tuple[int, ...]] | None:
        """A C-contiguous device copy of `obj` and the stream handles it was made
        on, or None where this handler cannot make one (or the device is full)."""
        return None

    def to_host(self, obj: Any, engine: TransferEngine) -> HostCopy:
        cai = self.interface(obj)
        low, high, offset = interface_extent(cai)
        if cai.get("strides") is not None and 2 * interface_nbytes(cai) <= high - low:
            dense = self.compact(obj)
            if dense is not None:
                array, streams = dense
                engine.order_after_producers(streams)
                host = self.to_host(array, engine)
                # Freed, `array` would go back to the pool of the stream that made it
                # while the copy stream may still read it.
                host.copies[0].source = array
                return host
        block, copy = engine.to_host(low, high - low)
        meta = {
            "shape": tuple(int(n) for n in cai["shape"]),
            "typestr": cai["typestr"],
            "descr": cai.get("descr"),
            "strides": None if cai.get("strides") is None else tuple(cai["strides"]),
            "offset": offset,
            "extent": high - low,
            "device": self.device_of(obj),
            "readonly": bool(cai["data"][1]),
        }
        meta.update(self.meta(obj))
        return HostCopy(self.name, meta, [block], [copy])

    def allocate(
        self, nbytes: int, meta: dict[str, Any], engine: TransferEngine
    ) -> tuple[int, Any]:
        return engine.backend.alloc_device(nbytes, meta["device"])

    def rebuild(self, owner: Any, ptr: int, meta: dict[str, Any], engine: TransferEngine) -> Any:
        return engine.backend.wrap_device(owner, ptr, self.interface_of(meta, ptr))

    @staticmethod
    def interface_of(meta: dict[str, Any], ptr: int) -> dict[str, Any]:
        cai: dict[str, Any] = {
            "shape": meta["shape"],
            "typestr": meta["typestr"],
            "data": (ptr, meta["readonly"]),
            "strides": meta["strides"],
            "version": 3,
        }
        if meta.get("descr"):
            cai["descr"] = meta["descr"]
        return cai

    def to_device(self, copy: HostCopy, engine: TransferEngine) -> tuple[Any, list[Copy]]:
        meta = copy.meta
        (block,) = copy.blocks
        base, owner = self.allocate(meta["extent"], meta, engine)
        after = copy.copies[0] if copy.copies else None
        h2d = engine.to_device(base, block.ptr, meta["extent"], after=after)
        return self.rebuild(owner, base + meta["offset"], meta, engine), [h2d]


class CupyHandler(CudaArrayInterfaceHandler):
    """cupy.ndarray: counts its whole `data.mem` allocation (so views and aliases
    count once in `cudask.memory.accounting`); compacts sparse views with
    `cupy.ascontiguousarray`; rebuilt as a cupy.ndarray with the same dtype, shape
    and strides on the same device."""

    name = "cupy"

    def accepts(self, obj: Any) -> bool:
        return True

    def allocations(self, obj: Any) -> list[Range]:
        mem = obj.data.mem
        size = int(mem.size)
        if size == 0:
            return []
        return [(int(mem.ptr), int(mem.ptr) + size)]

    def producer_streams(self, obj: Any) -> tuple[int, ...]:
        return ()

    def device_of(self, obj: Any) -> int:
        return int(obj.device.id)

    def interface(self, obj: Any) -> dict[str, Any]:
        return {
            "shape": obj.shape,
            "typestr": obj.dtype.str,
            "descr": None,
            "data": (int(obj.data.ptr), False),
            "strides": None if obj.flags.c_contiguous else obj.strides,
            "version": 3,
        }

    def meta(self, obj: Any) -> dict[str, Any]:
        return {"dtype": obj.dtype}

    def compact(self, obj: Any) -> tuple[Any, tuple[int, ...]] | None:
        import cupy

        try:
            with cupy.cuda.Device(obj.device.id):
                return cupy.ascontiguousarray(obj), (int(cupy.cuda.get_current_stream().ptr),)
        except (cupy.cuda.memory.OutOfMemoryError, MemoryError):
            return None  # copy the whole extent instead

    def allocate(
        self, nbytes: int, meta: dict[str, Any], engine: TransferEngine
    ) -> tuple[int, Any]:
        import cupy

        with cupy.cuda.Device(meta["device"]):
            memptr = cupy.cuda.alloc(max(nbytes, 1))
        return int(memptr.ptr), memptr

    def rebuild(self, owner: Any, ptr: int, meta: dict[str, Any], engine: TransferEngine) -> Any:
        import cupy

        return cupy.ndarray(
            meta["shape"],
            dtype=meta["dtype"],
            memptr=owner + (ptr - int(owner.ptr)),
            strides=meta["strides"],
        )


def register_cupy() -> None:
    import cupy

    register_handler(cupy.ndarray, CupyHandler())


class NumbaHandler(CudaArrayInterfaceHandler):
    """Numba DeviceNDArray: accounted and copied through its interface; rebuilt with
    numba.cuda.from_cuda_array_interface over a Numba device allocation."""

    name = "numba"

    def allocate(
        self, nbytes: int, meta: dict[str, Any], engine: TransferEngine
    ) -> tuple[int, Any]:
        from numba import cuda

        owner = cuda.device_array(max(nbytes, 1), dtype=numpy.uint8)
        return int(owner.__cuda_array_interface__["data"][0]), owner

    def rebuild(self, owner: Any, ptr: int, meta: dict[str, Any], engine: TransferEngine) -> Any:
        from numba import cuda

        return cuda.from_cuda_array_interface(self.interface_of(meta, ptr), owner=owner, sync=False)


def register_numba() -> None:
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    register_handler(DeviceNDArray, NumbaHandler())


__all__ = [
    "CudaArrayInterfaceHandler",
    "CupyHandler",
    "NumbaHandler",
    "interface_extent",
    "interface_nbytes",
    "interface_stream",
    "register_cupy",
    "register_numba",
]
