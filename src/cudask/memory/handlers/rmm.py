"""The RMM family: `rmm.DeviceBuffer`.

Covers: `RmmDeviceBufferHandler` (one allocation of `size` bytes at `ptr`,
copied whole and rebuilt as a new `DeviceBuffer(size=...)`; its producer
stream is the buffer's `stream` when not a default stream) and `register`,
which the package calls the first time an RMM object is met. The RMM
attributes it relies on are listed in docs/design/handlers.md.

Does not cover: RMM pools and their options (`cudask.worker`). DeviceBuffer
takes no weak references, so a spilled buffer still referenced elsewhere is
not tracked as alive (see `TieredStore`).

Threading: stateless; any thread. RMM is imported only inside the methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cudask.memory.accounting import Range
from cudask.memory.handlers.images import HostCopy
from cudask.memory.handlers.registry import register_handler

if TYPE_CHECKING:
    from cudask.memory.backend import Copy
    from cudask.memory.host.transfer import TransferEngine


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


def register() -> None:
    import rmm

    register_handler(rmm.DeviceBuffer, RmmDeviceBufferHandler())


__all__ = ["RmmDeviceBufferHandler", "register"]
