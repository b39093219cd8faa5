"""What is a device object, which device memory it holds, and how it moves.

Covers: a registry of `DeviceHandler`s by type (resolved through the MRO, with
lazy registration for CuPy, Numba, PyTorch, RMM and cuDF, which are imported
only when an object of theirs is met), a fallback for any object exposing
`__cuda_array_interface__`, and lists/tuples/dicts of device objects. For each
device object a handler gives:

- `allocations(obj)`: the device address ranges it keeps alive (the whole
  underlying allocation where the library says, e.g. `cupy.ndarray.data.mem`,
  so views and aliases are counted once by `cudask.memory.accounting`);
- `to_host(obj, engine)`: a `HostCopy` - metadata plus host blocks filled by
  raw device -> host copies enqueued on the engine's stream (no pickling);
- `to_device(copy, engine)`: the same type rebuilt from a `HostCopy` (CuPy
  array with dtype/shape/strides, torch tensor, Numba array, RMM DeviceBuffer,
  cuDF object through its own device_serialize/device_deserialize).

A `HostCopy` pickles to its metadata plus out-of-band buffers (pickle
protocol 5), so distributed's spill-to-disk writes its bytes without a copy.

Does not cover: when to move (`cudask.memory.store`) or how copies are issued
(`cudask.memory.transfer`). Objects a handler cannot move (e.g. a masked
`__cuda_array_interface__`) raise `UnspillableError`; the store then keeps
them on the device.

Threading: registration is expected at import time; lookups are safe from any
thread (dict reads; a racing double resolution is harmless).
"""

from __future__ import annotations

import logging
import pickle
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy

from cudask.memory.accounting import Range
from cudask.memory.host.blocks import HostBlock

if TYPE_CHECKING:
    from cudask.memory.backend import Copy
    from cudask.memory.host.transfer import TransferEngine

logger = logging.getLogger(__name__)


class UnspillableError(TypeError):
    """A device object that cudask cannot copy to host memory."""


# ----------------------------------------------------------------------------------
# Host copies
# ----------------------------------------------------------------------------------
class HostCopy:
    """The host image of one device object: handler name, metadata and blocks.

    `copies` are the device -> host copies filling `blocks`; `ready()` says whether
    they completed, `wait()` blocks until they do. When the HostCopy dies its
    blocks go back to the pinned pool once those copies completed.
    """

    __slots__ = ("__weakref__", "blocks", "copies", "handler", "meta", "source_streams")

    def __init__(
        self,
        handler: str,
        meta: dict[str, Any],
        blocks: list[HostBlock],
        copies: list[Copy] | None = None,
    ) -> None:
        self.handler = handler
        self.meta = meta
        self.blocks = blocks
        self.copies = copies or []
        for i, block in enumerate(blocks):
            weakref.finalize(self, block.release, self.copies[i] if i < len(self.copies) else None)

    @property
    def nbytes(self) -> int:
        return sum(block.nbytes for block in self.blocks)

    def ready(self) -> bool:
        return all(copy.ready() for copy in self.copies)

    def wait(self) -> None:
        for copy in self.copies:
            copy.wait()

    def pinned(self) -> bool:
        return all(block.pinned for block in self.blocks)

    def __sizeof__(self) -> int:
        return self.nbytes + 200

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        self.wait()
        if isinstance(protocol, int) and protocol >= 5:
            # over NumPy arrays, not memoryviews: see HostBlock.array
            frames: list[Any] = [pickle.PickleBuffer(cast(Any, block.array))
                                 for block in self.blocks]
        else:
            frames = [bytes(block.view) for block in self.blocks]
        return (_rebuild_host_copy, (self.handler, self.meta, frames))

    def __repr__(self) -> str:
        return f"<HostCopy {self.handler} {self.nbytes} B>"


def _rebuild_host_copy(handler: str, meta: dict[str, Any], frames: list[Any]) -> HostCopy:
    return HostCopy(handler, meta, [HostBlock.wrap(frame) for frame in frames])


class ContainerCopy:
    """The host image of a list/tuple/dict holding device objects: items are
    HostCopy/ContainerCopy, or host objects kept as they are."""

    __slots__ = ("__weakref__", "items", "keys", "kind")

    def __init__(self, kind: str, keys: list[Any] | None, items: list[Any]) -> None:
        self.kind = kind
        self.keys = keys
        self.items = items

    def parts(self) -> list[HostCopy]:
        out: list[HostCopy] = []
        for item in self.items:
            if isinstance(item, HostCopy):
                out.append(item)
            elif isinstance(item, ContainerCopy):
                out.extend(item.parts())
        return out

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts())

    def ready(self) -> bool:
        return all(p.ready() for p in self.parts())

    def wait(self) -> None:
        for p in self.parts():
            p.wait()

    def pinned(self) -> bool:
        return all(p.pinned() for p in self.parts())

    def __sizeof__(self) -> int:
        return self.nbytes + 200 + 64 * len(self.items)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ContainerCopy, (self.kind, self.keys, self.items))


AnyHostCopy = HostCopy | ContainerCopy


# ----------------------------------------------------------------------------------
# Handlers
# ----------------------------------------------------------------------------------
class DeviceHandler(Protocol):
    """How one family of device objects is accounted, copied out and rebuilt."""

    name: str

    def accepts(self, obj: Any) -> bool:
        """Whether `obj` (an instance of a registered type) lives on the device."""

    def allocations(self, obj: Any) -> list[Range]:
        """Device address ranges that `obj` keeps alive."""

    def producer_streams(self, obj: Any) -> tuple[int, ...]:
        """Raw stream handles the object's data was last written on, when known."""

    def to_host(self, obj: Any, engine: TransferEngine) -> HostCopy:
        """Enqueue copies of the object's device data into host blocks."""

    def to_device(self, copy: HostCopy, engine: TransferEngine) -> tuple[Any, list[Copy]]:
        """Rebuild the object from `copy`; return it and the copies to wait for."""


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


def _interface_stream(cai: dict[str, Any]) -> tuple[int, ...]:
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
    when the subclass can make one (`compact`): spilling a column of a 200 MB chunk
    then moves the column, not the chunk, and unspilling it allocates the column.
    It comes back C-contiguous, with the same shape, dtype and values.
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
        return _interface_stream(obj.__cuda_array_interface__)

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


class NumbaHandler(CudaArrayInterfaceHandler):
    """Numba DeviceNDArray: rebuilt with numba.cuda.from_cuda_array_interface over
    a numba device allocation."""

    name = "numba"

    def allocate(self, nbytes: int, meta: dict[str, Any], engine: TransferEngine) -> tuple[int, Any]:
        from numba import cuda

        owner = cuda.device_array(max(nbytes, 1), dtype=numpy.uint8)
        return int(owner.__cuda_array_interface__["data"][0]), owner

    def rebuild(self, owner: Any, ptr: int, meta: dict[str, Any], engine: TransferEngine) -> Any:
        from numba import cuda

        return cuda.from_cuda_array_interface(self.interface_of(meta, ptr), owner=owner, sync=False)


class TorchHandler:
    """torch.Tensor on a CUDA device: counts its storage; rebuilt with torch.as_strided
    over a new storage on the same device (dtype, shape, strides, requires_grad
    kept; autograd history is not)."""

    name = "torch"

    def accepts(self, obj: Any) -> bool:
        return bool(obj.is_cuda)

    def allocations(self, obj: Any) -> list[Range]:
        storage = obj.untyped_storage()
        size = int(storage.nbytes())
        return [(int(storage.data_ptr()), int(storage.data_ptr()) + size)] if size else []

    def producer_streams(self, obj: Any) -> tuple[int, ...]:
        return ()

    def to_host(self, obj: Any, engine: TransferEngine) -> HostCopy:
        itemsize = obj.element_size()
        shape = tuple(obj.shape)
        strides = tuple(obj.stride())
        if obj.numel() == 0:
            low = high = 0
        else:
            low = sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
            high = sum((n - 1) * s for n, s in zip(shape, strides) if s > 0) + 1
        start = int(obj.data_ptr()) + low * itemsize
        extent = (high - low) * itemsize
        block, copy = engine.to_host(start, extent)
        meta = {
            "dtype": str(obj.dtype).removeprefix("torch."),
            "shape": shape,
            "strides": strides,
            "offset": -low,
            "extent": extent,
            "device": int(obj.device.index or 0),
            "requires_grad": bool(obj.requires_grad),
        }
        return HostCopy(self.name, meta, [block], [copy])

    def to_device(self, copy: HostCopy, engine: TransferEngine) -> tuple[Any, list[Copy]]:
        import torch

        meta = copy.meta
        dtype = getattr(torch, meta["dtype"])
        itemsize = torch.empty((), dtype=dtype).element_size()
        elements = max(meta["extent"] // itemsize, 1)
        flat = torch.empty(elements, dtype=dtype, device=f"cuda:{meta['device']}")
        (block,) = copy.blocks
        after = copy.copies[0] if copy.copies else None
        h2d = engine.to_device(int(flat.data_ptr()), block.ptr, meta["extent"], after=after)
        out = torch.as_strided(flat, meta["shape"], meta["strides"], meta["offset"])
        if meta["requires_grad"]:
            out.requires_grad_(True)
        return out, [h2d]


class RmmDeviceBufferHandler:
    """rmm.DeviceBuffer: one allocation of `size` bytes at `ptr`.

    Uses only what rmm 26.10's DeviceBuffer has (checked against its .pyi):
    `DeviceBuffer(size=...)`, `.ptr`, `.size` and `.stream` (whose
    `__cuda_stream__()` gives the raw handle). DeviceBuffer does not support
    weak references, so a spilled buffer still referenced elsewhere is not
    tracked as alive (see `TieredStore`).
    """

    name = "rmm"

    def accepts(self, obj: Any) -> bool:
        return True

    def allocations(self, obj: Any) -> list[Range]:
        size = int(obj.size)
        return [(int(obj.ptr), int(obj.ptr) + size)] if size else []

    def producer_streams(self, obj: Any) -> tuple[int, ...]:
        """The stream the buffer was created on, when not a default stream (the
        copy stream always waits for the legacy default stream)."""
        stream = getattr(obj, "stream", None)
        try:
            handle = int(stream.__cuda_stream__()[1]) if stream is not None else 0
        except Exception:  # noqa: BLE001 - older rmm: no __cuda_stream__
            return ()
        return (handle,) if handle else ()

    def to_host(self, obj: Any, engine: TransferEngine) -> HostCopy:
        block, copy = engine.to_host(int(obj.ptr), int(obj.size))
        return HostCopy(self.name, {"size": int(obj.size)}, [block], [copy])

    def to_device(self, copy: HostCopy, engine: TransferEngine) -> tuple[Any, list[Copy]]:
        import rmm

        size = copy.meta["size"]
        out = rmm.DeviceBuffer(size=size)
        (block,) = copy.blocks
        after = copy.copies[0] if copy.copies else None
        return out, [engine.to_device(int(out.ptr), block.ptr, size, after=after)]


class CudfHandler:
    """cuDF objects (DataFrame, Series, Index, columns): moved through their own
    `device_serialize()` / `device_deserialize()`; device frames are copied
    raw, host frames kept as they are."""

    name = "cudf"

    def accepts(self, obj: Any) -> bool:
        return hasattr(obj, "device_serialize")

    def _frames(self, obj: Any) -> tuple[dict[str, Any], list[Any]]:
        header, frames = obj.device_serialize()
        return header, frames

    def allocations(self, obj: Any) -> list[Range]:
        header, frames = self._frames(obj)
        out: list[Range] = []
        for is_cuda, frame in zip(header["is-cuda"], frames):
            if is_cuda:
                low, high, _ = interface_extent(frame.__cuda_array_interface__)
                if high > low:
                    out.append((low, high))
        return out

    def producer_streams(self, obj: Any) -> tuple[int, ...]:
        return ()

    def to_host(self, obj: Any, engine: TransferEngine) -> HostCopy:
        header, frames = self._frames(obj)
        blocks: list[HostBlock] = []
        copies: list[Copy] = []
        kinds: list[str] = []
        for is_cuda, frame in zip(header["is-cuda"], frames):
            if is_cuda:
                low, high, _ = interface_extent(frame.__cuda_array_interface__)
                block, copy = engine.to_host(low, high - low)
                blocks.append(block)
                copies.append(copy)
                kinds.append("device")
            else:
                view = memoryview(frame).cast("B")
                block = HostBlock.pageable(view.nbytes)
                block.view[:] = view
                blocks.append(block)
                copies.append(_NoCopy())  # type: ignore[arg-type]
                kinds.append("host")
        meta = {"header": header, "kinds": kinds, "type": pickle.dumps(type(obj))}
        return HostCopy(self.name, meta, blocks, copies)  # type: ignore[arg-type]

    def to_device(self, copy: HostCopy, engine: TransferEngine) -> tuple[Any, list[Copy]]:
        import rmm

        frames: list[Any] = []
        h2d: list[Copy] = []
        for i, (kind, block) in enumerate(zip(copy.meta["kinds"], copy.blocks, strict=True)):
            # a host copy rebuilt from pickle (a proxy sent to a client) has no copies
            filled = copy.copies[i] if i < len(copy.copies) else None
            if kind == "device":
                buf = rmm.DeviceBuffer(size=block.nbytes)
                h2d.append(
                    engine.to_device(
                        int(buf.ptr), block.ptr, block.nbytes,
                        after=None if filled is None or isinstance(filled, _NoCopy) else filled,
                    )
                )
                frames.append(buf)
            else:
                frames.append(bytes(block.view))
        for c in h2d:
            c.wait()
        cls = pickle.loads(copy.meta["type"])
        return cls.device_deserialize(copy.meta["header"], frames), []


class _NoCopy:
    """Stands for a copy that already happened (host frames)."""

    def ready(self) -> bool:
        return True

    def wait(self) -> None:
        return None


# ----------------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------------
_HANDLERS: dict[type, DeviceHandler] = {}
_RESOLVED: dict[type, DeviceHandler | None] = {}
_LAZY: dict[str, Callable[[], None]] = {}
_BY_NAME: dict[str, DeviceHandler] = {}
GENERIC = CudaArrayInterfaceHandler()
_BY_NAME[GENERIC.name] = GENERIC
_CONTAINERS = (list, tuple, dict)
_HOST_LEAVES = frozenset({int, float, complex, str, bytes, bytearray, bool, type(None),
                          memoryview, numpy.ndarray})


def register_handler(typ: type, handler: DeviceHandler) -> None:
    """Use `handler` for instances of `typ` (and subclasses without their own)."""
    _HANDLERS[typ] = handler
    _BY_NAME[handler.name] = handler
    _RESOLVED.clear()


def register_lazy(toplevel: str, register: Callable[[], None]) -> None:
    """Call `register()` the first time an object of module `toplevel` is met, or the first
    time a host copy names the handler `toplevel` (handlers are named after their library:
    a process that receives a spilled proxy, a client say, may never have met the library)."""
    _LAZY[toplevel] = register


def handler_named(name: str) -> DeviceHandler:
    """The handler that made a host copy, registering it now if its library was never met."""
    register = _LAZY.pop(name, None) if name not in _BY_NAME else None
    if register is not None:
        try:
            register()
        except ImportError as exc:
            raise UnspillableError(
                f"data spilled from {name!r} objects cannot be rebuilt here: {exc}"
            ) from None
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnspillableError(f"no device handler named {name!r} is registered") from None


def _register_cupy() -> None:
    import cupy

    register_handler(cupy.ndarray, CupyHandler())


def _register_numba() -> None:
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    register_handler(DeviceNDArray, NumbaHandler())


def _register_torch() -> None:
    import torch

    register_handler(torch.Tensor, TorchHandler())


def _register_rmm() -> None:
    import rmm

    register_handler(rmm.DeviceBuffer, RmmDeviceBufferHandler())


def _register_cudf() -> None:
    from cudf.core.abc import Serializable

    register_handler(Serializable, CudfHandler())


register_lazy("cupy", _register_cupy)
register_lazy("numba", _register_numba)
register_lazy("numba_cuda", _register_numba)
register_lazy("torch", _register_torch)
register_lazy("rmm", _register_rmm)
register_lazy("cudf", _register_cudf)


def _resolve(typ: type) -> DeviceHandler | None:
    for cls in typ.__mro__:
        toplevel = cls.__module__.partition(".")[0]
        register = _LAZY.pop(toplevel, None)
        if register is not None:
            try:
                register()
            except ImportError:
                logger.debug("cudask: could not register device handler for %s", toplevel)
    for cls in typ.__mro__:
        handler = _HANDLERS.get(cls)
        if handler is not None:
            return handler
    if hasattr(typ, "__cuda_array_interface__"):
        return GENERIC
    return None


def _leaf_handler(obj: Any) -> DeviceHandler | None:
    typ = type(obj)
    if typ in _HOST_LEAVES:
        return None
    try:
        handler = _RESOLVED[typ]
    except KeyError:
        handler = _RESOLVED[typ] = _resolve(typ)
    if handler is None:
        if hasattr(obj, "__cuda_array_interface__"):  # set on the instance
            handler = GENERIC
        else:
            return None
    return handler if handler.accepts(obj) else None


def is_device_object(obj: Any) -> bool:
    """Whether `obj` is, or is a list/tuple/dict containing, a device object."""
    if type(obj) in _CONTAINERS:
        values = obj.values() if type(obj) is dict else obj
        return any(is_device_object(v) for v in values)
    return _leaf_handler(obj) is not None


def device_leaves(obj: Any) -> list[tuple[Any, DeviceHandler]]:
    """The device objects inside `obj` (itself when it is one) with their handlers."""
    if type(obj) in _CONTAINERS:
        values = obj.values() if type(obj) is dict else obj
        return [leaf for v in values for leaf in device_leaves(v)]
    handler = _leaf_handler(obj)
    return [] if handler is None else [(obj, handler)]


def allocations(obj: Any) -> list[Range]:
    """Device address ranges kept alive by `obj` (possibly overlapping)."""
    return [r for leaf, handler in device_leaves(obj) for r in handler.allocations(leaf)]


def producer_streams(obj: Any) -> tuple[int, ...]:
    return tuple(s for leaf, handler in device_leaves(obj) for s in handler.producer_streams(leaf))


def to_host(obj: Any, engine: TransferEngine) -> AnyHostCopy:
    """Enqueue the copies of every device object in `obj`; host objects inside
    containers are kept as they are."""
    typ = type(obj)
    if typ in _CONTAINERS:
        if typ is dict:
            keys = list(obj)
            return ContainerCopy("dict", keys, [_to_host_item(obj[k], engine) for k in keys])
        return ContainerCopy(typ.__name__, None, [_to_host_item(v, engine) for v in obj])
    handler = _leaf_handler(obj)
    if handler is None:
        raise UnspillableError(f"{typ.__name__} is not a device object")
    return handler.to_host(obj, engine)


def _to_host_item(obj: Any, engine: TransferEngine) -> Any:
    return to_host(obj, engine) if is_device_object(obj) else obj


def to_device(copy: AnyHostCopy, engine: TransferEngine) -> tuple[Any, list[Copy]]:
    """Rebuild the object `copy` was made from; return it and the host -> device
    copies to wait for before handing it out."""
    if isinstance(copy, ContainerCopy):
        pending: list[Copy] = []
        items: list[Any] = []
        for item in copy.items:
            if isinstance(item, HostCopy | ContainerCopy):
                value, copies = to_device(item, engine)
                pending.extend(copies)
                items.append(value)
            else:
                items.append(item)
        if copy.kind == "dict":
            assert copy.keys is not None
            return dict(zip(copy.keys, items)), pending
        return (tuple(items) if copy.kind == "tuple" else items), pending
    return handler_named(copy.handler).to_device(copy, engine)


def weak_leaves(obj: Any) -> list[weakref.ref[Any]] | None:
    """Weak references to every device object in `obj`, or None when one of them
    does not support weak references."""
    refs: list[weakref.ref[Any]] = []
    for leaf, _ in device_leaves(obj):
        try:
            refs.append(weakref.ref(leaf))
        except TypeError:
            return None
    return refs


__all__ = [
    "AnyHostCopy",
    "ContainerCopy",
    "CudaArrayInterfaceHandler",
    "CudfHandler",
    "CupyHandler",
    "DeviceHandler",
    "HostCopy",
    "NumbaHandler",
    "RmmDeviceBufferHandler",
    "TorchHandler",
    "UnspillableError",
    "allocations",
    "device_leaves",
    "handler_named",
    "interface_extent",
    "interface_nbytes",
    "is_device_object",
    "producer_streams",
    "register_handler",
    "register_lazy",
    "to_device",
    "to_host",
    "weak_leaves",
]
