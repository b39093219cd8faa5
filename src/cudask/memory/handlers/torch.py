"""The PyTorch family: `torch.Tensor` on a CUDA device.

Covers: `TorchHandler` (counts the tensor's whole untyped storage; copies the
extent of its elements; rebuilds it with `torch.as_strided` over a new storage
on the same device, keeping dtype, shape, strides and `requires_grad`, not its
autograd history) and `register`, which the package calls the first time a
torch object is met. CPU tensors are not device objects (`accepts`).

Does not cover: PyTorch's caching allocator (the store counts what tensors
keep alive, not what the allocator holds).

Threading: stateless; any thread. PyTorch is imported only inside the methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cudask.memory.accounting import Range
from cudask.memory.handlers.images import HostCopy
from cudask.memory.handlers.registry import register_handler

if TYPE_CHECKING:
    from cudask.memory.backend import Copy
    from cudask.memory.host.transfer import TransferEngine


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


def register() -> None:
    import torch

    register_handler(torch.Tensor, TorchHandler())


__all__ = ["TorchHandler", "register"]
