"""Handlers of the libraries whose objects are read through their own API: one
allocation each, described by the library's attributes, not by an interface.

Covers: `TorchHandler` (`torch.Tensor` on a CUDA device: counts its whole
untyped storage, copies the extent of its elements, rebuilds it with
`torch.as_strided` on the same device; CPU tensors are not device objects) and
`RmmDeviceBufferHandler` (`rmm.DeviceBuffer`: `size` bytes at `ptr`, copied
whole; its producer stream is its `stream`), each with its lazy `register`.

Does not cover: PyTorch's caching allocator (the store counts what tensors
keep alive), RMM pools (`cudask.worker`), cuDF (`cudf`). DeviceBuffer takes no
weak references, so a spilled buffer still referenced elsewhere is not
tracked as alive.

Threading: stateless; any thread. PyTorch and RMM are imported only inside the
methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cudask.memory.accounting import Range
from cudask.memory.handlers.images import HostCopy
from cudask.memory.handlers.registry import register_handler

if TYPE_CHECKING:
    from cudask.memory.backend import Copy
    from cudask.memory.host.copy_engine import TransferEngine


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


def register_torch() -> None:
    import torch

    register_handler(torch.Tensor, TorchHandler())


class RmmDeviceBufferHandler:
    """rmm.DeviceBuffer: one allocation of `size` bytes at `ptr`.

    Uses only `DeviceBuffer(size=...)`, `.ptr`, `.size` and `.stream` (whose
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


def register_rmm() -> None:
    import rmm

    register_handler(rmm.DeviceBuffer, RmmDeviceBufferHandler())


__all__ = ["RmmDeviceBufferHandler", "TorchHandler", "register_rmm", "register_torch"]
