"""The generic handler: any object exposing `__cuda_array_interface__`.

Covers: `CudaArrayInterfaceHandler`, used for objects no registered handler
claims (v2/v3 interfaces without a mask) and the base of the CuPy and Numba
handlers, which override its hooks (`interface`, `device_of`, `meta`,
`compact`, `allocate`, `rebuild`). The copy covers the object's extent, from
its lowest to its highest byte, so strided views keep their strides; a sparse
view (elements filling at most half its extent) goes through a C-contiguous
device copy where the subclass can make one (`compact`) and comes back
C-contiguous. A foreign type is rebuilt as the copy backend's array type.

Does not cover: objects with a mask (`UnspillableError`), choosing this
handler (`registry`), the reasons behind the sparse rule
(docs/design/handlers.md).

Threading: stateless; any thread. The copies are enqueued on the engine's
streams and complete later (see `HostCopy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cudask.memory.accounting import Range
from cudask.memory.handlers.geometry import interface_extent, interface_nbytes, interface_stream
from cudask.memory.handlers.images import HostCopy
from cudask.memory.handlers.protocol import UnspillableError

if TYPE_CHECKING:
    from cudask.memory.backend import Copy
    from cudask.memory.host.transfer import TransferEngine


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

    def allocate(self, nbytes: int, meta: dict[str, Any], engine: TransferEngine) -> tuple[int, Any]:
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


__all__ = ["CudaArrayInterfaceHandler"]
