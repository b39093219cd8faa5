"""The CuPy family: `cupy.ndarray`.

Covers: `CupyHandler` (counts the whole `data.mem` allocation of an array, so
views and aliases are counted once by `cudask.memory.accounting`; compacts
sparse views with `cupy.ascontiguousarray`; rebuilds a `cupy.ndarray` with the
same dtype, shape and strides on the same device) and `register`, which the
package calls the first time a CuPy object is met.

Does not cover: CuPy as the copy backend (`cudask.memory.backend`, `cudask.memory.host.transfer`), arrays of
other libraries exposing `__cuda_array_interface__` (`cai`).

Threading: stateless; any thread. CuPy is imported only inside the methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cudask.memory.accounting import Range
from cudask.memory.handlers.cai import CudaArrayInterfaceHandler
from cudask.memory.handlers.registry import register_handler

if TYPE_CHECKING:
    from cudask.memory.host.transfer import TransferEngine


class CupyHandler(CudaArrayInterfaceHandler):
    """cupy.ndarray: counts its whole `data.mem` allocation; rebuilt as a
    cupy.ndarray with the same dtype, shape and strides."""

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

    def allocate(self, nbytes: int, meta: dict[str, Any], engine: TransferEngine) -> tuple[int, Any]:
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


def register() -> None:
    import cupy

    register_handler(cupy.ndarray, CupyHandler())


__all__ = ["CupyHandler", "register"]
